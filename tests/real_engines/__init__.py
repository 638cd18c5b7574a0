"""Tests against real vLLM engines (the lab); skipped unless pytest gets --real-engines."""
