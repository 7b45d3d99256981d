"""``python -m cosmos_robot_server.alpasim --help``: see ``launcher.py``."""

from cosmos_robot_server.alpasim.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
