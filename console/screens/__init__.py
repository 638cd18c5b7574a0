"""The console's screens and dialogs."""
