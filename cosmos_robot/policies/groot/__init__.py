"""The ``groot`` family: LeRobot GR00T N1.7 folders served through LeRobot's own model and processors.

- ``policy``: ``Gr00tPolicy``, the ``BatchPolicy`` the server and the eval runner call;
- ``tiny``: tiny random GR00T checkpoints (backbone, base, policy folders) built offline with
  LeRobot's and transformers' public classes, for tests and smoke runs.
"""
