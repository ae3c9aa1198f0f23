"""Skulk speech: text to speech (Piper), speech to text (faster-whisper), realtime transcription."""
