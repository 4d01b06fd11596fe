"""Response headers this server adds (exposed to browsers through CORS)."""

REQUEST_ID = "x-request-id"
MODEL = "x-qwen3tts-model"
"""The served model that answered (aliases such as tts-1 resolved)."""
VOICE = "x-qwen3tts-voice"
"""Who speaks: the speaker (OpenAI names resolved), a profile id, or "instructions" (VoiceDesign)."""
INSTRUCTIONS_IGNORED = "x-qwen3tts-instructions-ignored"
""""true" when `instructions` were sent to a model that cannot take them (e.g. 0.6B CustomVoice)."""
VOICE_IGNORED = "x-qwen3tts-voice-ignored"
""""true" when `voice` was not used because the instructions define the voice (VoiceDesign)."""
IGNORED_FIELDS = "x-qwen3tts-ignored-fields"
"""Comma-separated request fields this server does not know and therefore ignored."""

EXPOSED = (REQUEST_ID, MODEL, VOICE, INSTRUCTIONS_IGNORED, VOICE_IGNORED, IGNORED_FIELDS)
