class LoadError(ValueError):
    """A model that cannot be loaded. The message is one line naming the cause and the fix."""
