"""Socket protocols: the shared base, native /v1/ws and its resume, OpenAI Realtime, ElevenLabs, Wyoming."""
