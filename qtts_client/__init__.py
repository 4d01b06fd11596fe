"""qtts_client: a small client for Qwen3-TTS-X servers (needs only `websockets` and the standard library).

One-shot speech (POST /v1/audio/speech, urllib):

    import qtts_client
    wav = qtts_client.speak("Hello there.", voice="ryan", base_url="http://127.0.0.1:8100")

Live text, e.g. an LLM's tokens (WebSocket /v1/ws): audio comes while the text is still being written.

    from qtts_client import Audio, Client, Done, Progress

    with Client("http://127.0.0.1:8100", api_key="...") as client:
        print(client.capabilities().formats)

        for event in client.stream_text(llm_tokens(), voice="ryan", format="pcm", progress=True):
            if isinstance(event, Audio):
                player.write(event.data)              # s16le, 24 kHz, mono
            elif isinstance(event, Progress):
                highlight(event.spoken_end_estimate)  # characters spoken so far (estimate)
            elif isinstance(event, Done):
                print(event.finish_reason, event.usage)

        # or step by step (send_text may be called from another thread while this one reads):
        with client.stream(voice="ryan", seed=1) as utterance:
            utterance.send_text("Hello ")
            utterance.send_text("world.")
            utterance.finish()
            audio, done = utterance.collect()

        # several utterances, one after another, on one connection:
        with client.connect() as socket:
            for line in lines:
                utterance = socket.start("ryan")
                utterance.send_text(line)
                utterance.finish()
                audio, done = utterance.collect()

asyncio: `AsyncClient` has the same methods (`await client.speak(...)`, `async with client.stream(...)
as utterance`, `await utterance.send_text(...)`, `async for event in utterance`,
`async for event in client.stream_text(deltas, ...)`).

Utterances are resumable when the server offers it (`capabilities().supports("qtts", "resume")`): a
connection lost mid-stream is resumed on a new one, nothing lost or repeated (a `Resumed` event says
so). Server errors raise `APIError` (`.code`, `.type`, `.param`, `.status`, the envelope in `.body`);
network failures raise `TransportError`. `base_url` and `api_key` default to $QTTS_BASE_URL and
$QTTS_API_KEY; `base_url` may carry a proxy's path prefix (`https://example.com/tts`). `verify=` (a CA
file, an `ssl.SSLContext`, or False) checks an https server's certificate; True: the system's CAs.
Every server hands this package out: `pip install http://HOST:PORT/sdk/qtts_client-<version>-py3-none-any.whl`.
"""

from .aio import AsyncClient, AsyncSpeechSocket, AsyncUtterance
from .errors import (
    APIError,
    AuthenticationError,
    NotFoundError,
    ProtocolError,
    QTTSError,
    RateLimitError,
    ResumeFailed,
    TransportError,
)
from .sync import Client, SpeechSocket, Utterance, capabilities, speak
from .types import Audio, Capabilities, Done, Event, ModelInfo, Progress, ProtocolInfo, Resumed, Started, Usage

__version__ = "0.1.0"

__all__ = [
    "speak", "capabilities", "Client", "SpeechSocket", "Utterance", "AsyncClient", "AsyncSpeechSocket",
    "AsyncUtterance", "Audio", "Progress", "Resumed", "Done", "Started", "Usage", "Event", "Capabilities",
    "ProtocolInfo", "ModelInfo", "QTTSError", "APIError", "AuthenticationError", "NotFoundError", "RateLimitError",
    "ResumeFailed", "TransportError", "ProtocolError",
]
