"""``python -m cosmos_robot.cli`` (what tests and ``make demo`` run): the same as ``cosmos-robot``."""

from cosmos_robot.cli import main

main()
