import sys

from qwen3_tts_gguf.cli import main

sys.exit(main())
