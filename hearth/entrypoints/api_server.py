"""`python -m hearth.entrypoints.api_server --model MODEL ...`: vLLM's older module path, the same OpenAI server as
`hearth serve` (vLLM's own module there is a demo server; hearth starts the real one rather than refuse)."""
import sys

from hearth.entrypoints.openai.cli_serve import main

if __name__ == "__main__":
    sys.exit(main())
