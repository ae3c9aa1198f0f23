"""Skulk's bully election plugin (entry point: `skulk_election_bully.plugin`)."""
