"""`python -m hearth.entrypoints.openai.api_server --model MODEL ...`: vLLM's module path for the OpenAI server.

The same server and flags as `hearth serve` (cli_serve), so vLLM launch lines run with the package renamed.
"""
import sys

from hearth.entrypoints.openai.cli_serve import main

if __name__ == "__main__":
    sys.exit(main())
