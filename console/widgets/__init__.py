"""The dashboard's widgets; each draws view-model values and redraws only what changed."""
