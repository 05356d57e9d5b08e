"""The web chat page at / and the /status route it polls."""
