"""cosmos-robot-exporters: self-contained exports of policy folders and training runs, each with a manifest.

``export_checkpoint(source, out, target=..., base=...)`` finds the family of ``source`` (a policy
folder, a training run or one of its checkpoints) and hands it to that family's ``Exporter``
(registered in ``cosmos_robot.policies.registry``): ``flow`` -> our policy folder, ``pi05`` -> a
LeRobot ``pi05`` folder, ``groot`` -> a GR00T N1.7 base with the trained action head. Every export is
written to ``<out>.tmp``, gets ``manifest.json`` (file checksums, ``cosmos_robot.manifest``) and is
then renamed to ``out``.
"""

from cosmos_robot_exporters.base import Exporter, ExportError, ExportResult, export_checkpoint

__all__ = ["ExportError", "ExportResult", "Exporter", "export_checkpoint"]
