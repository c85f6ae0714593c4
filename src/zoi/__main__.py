"""`python -m zoi`: the `zoi` command."""

from zoi.cli import main

raise SystemExit(main())
