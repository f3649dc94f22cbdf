"""``python -m tf_amp.cli``: the ``tf-amp`` command."""

import sys

from tf_amp.cli import main

sys.exit(main())
