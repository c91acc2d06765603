"""Offline reading of finished profiles: the profile reader, selections, summary, findings,
diff, merge, the CANN 8 layout and the HTML report."""
