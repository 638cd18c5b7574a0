"""The emulator reads the GPU profiles a fleet file names, beside the built-in ones."""

from __future__ import annotations

from pathlib import Path

from router.config import load_fleet
from router.emulator.fleet import EmulatedFleet

FLEET = """\
model: meta-llama/Llama-3.1-8B-Instruct
profiles: [cards.yaml]
nodes:
  - name: n0
    gpus: [{index: 0, model: X-100, memory_gib: 80}]
    replicas:
      - {id: r0, endpoint: "http://127.0.0.1:18001", gpus: [0]}
"""

CARDS = """\
gpus:
  X-100:
    fp16_tflops: 312
    bf16: true
    bandwidth_gbs: 4078
    memory_mib: 81920
"""


def test_a_card_known_only_from_the_fleets_profiles_file_is_emulated(tmp_path: Path) -> None:
    (tmp_path / "cards.yaml").write_text(CARDS)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    fleet = EmulatedFleet(load_fleet(tmp_path / "fleet.yaml"))
    replica = fleet.replicas["r0"]
    assert replica.deployment.gpu.name == "X-100"
    assert replica.deployment.gpu.bandwidth_gbs == 4078
