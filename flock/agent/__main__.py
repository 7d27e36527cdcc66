"""``python -m flock.agent`` is ``flock-agent``."""

from flock.agent._main import main

main()
