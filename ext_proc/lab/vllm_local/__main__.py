"""``python -m ext_proc.lab.vllm_local install|build-model|serve|record``: see ``cli``."""

import sys

from ext_proc.lab.vllm_local.cli import main

sys.exit(main())
