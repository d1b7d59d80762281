"""``python -m lit_entropy fit --config ...``."""

from lit_entropy.cli import main

main()
