"""Images in a request: decoding and checking the bytes (image_io), the family's placeholder and token count
(families), the transformers image processor and the prompt's placeholder expansion (processing), and what the
engine receives (inputs: pixels, position, hash). Request vocabulary: below the engine, which only sees inputs."""
