"""The emulator-vLLM contract: probes, shapes and the golden files recorded from vLLM."""
