"""The console's view models: plain data computed from router snapshots, with no Textual.

Every function here is pure (snapshot and telemetry in, frozen rows out), so what the
dashboard shows is unit-tested without a terminal; the widgets only draw these values.
"""
