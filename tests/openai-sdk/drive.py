"""Drives `drama serve` with the official `openai` Python SDK, as an OpenAI speech app would
after changing only its base URL, and decodes every format with libsndfile (through
`soundfile`), a decoder that is not drama's. Prints one JSON object of what it measured;
any mismatch raises, so the process fails.

Usage: python drive.py BASE_URL RECORDING.wav"""

import io
import json
import sys

import numpy as np
import soundfile
from openai import OpenAI

base_url, recording = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="not-used-by-drama")
TEXT = "The SDK speaks. Every format agrees."
SEED = {"seed": 5}
report = {"sdk": __import__("openai").__version__, "libsndfile": soundfile.__libsndfile_version__, "formats": {}}


def speak(**kwargs):
    return client.audio.speech.create(model="gpt-4o-mini-tts", input=TEXT, extra_body=SEED, **kwargs)


def snr_db(want, got):
    noise = np.sum((want.astype(np.float64) - got.astype(np.float64)) ** 2)
    return float(10 * np.log10(np.sum(want.astype(np.float64) ** 2) / max(noise, 1e-9)))


# The reference: raw 16-bit PCM.
pcm = np.frombuffer(speak(voice="alloy", response_format="pcm").content, dtype="<i2")
assert pcm.size > 0, "no PCM"
for fmt in ["wav", "flac", "mp3", "opus"]:
    whole = speak(voice="alloy", response_format=fmt).content
    # Streamed as the SDK streams: the same bytes.
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", input=TEXT, voice="alloy", response_format=fmt, stream_format="audio", extra_body=SEED
    ) as response:
        streamed = b"".join(response.iter_bytes())
    if fmt in ("wav", "flac"):
        # Streamed, a WAV's sizes and a FLAC's length and MD5 are unknown: the headers differ.
        header = 44 if fmt == "wav" else 42
        assert streamed[header:] == whole[header:], f"{fmt}: streamed samples differ"
    else:
        assert streamed == whole, f"{fmt}: streamed bytes differ from whole"
    decoded, rate = soundfile.read(io.BytesIO(whole), dtype="int16")
    entry = {"bytes": len(whole), "rate": rate, "samples": int(decoded.size), "pcm_samples": int(pcm.size)}
    if fmt in ("wav", "flac"):
        assert rate == 24000 and np.array_equal(decoded, pcm), f"{fmt}: not the PCM's samples"
        entry["exact"] = True
    else:
        # Lossy: the Ogg Opus pre-skip and end position give back the length exactly; MP3
        # adds the encoder's delay and whole frames.
        assert rate == 24000, f"{fmt}: {rate} Hz"
        assert decoded.size == pcm.size if fmt == "opus" else decoded.size >= pcm.size, f"{fmt}: {decoded.size} samples"
        # Find the decoder's delay, then compare.
        lags = range(0, min(decoded.size, 3000))
        best = max(lags, key=lambda lag: snr_db(pcm, np.pad(decoded[lag:], (0, max(0, pcm.size + lag - decoded.size)))[: pcm.size]))
        aligned = np.pad(decoded[best:], (0, max(0, pcm.size + best - decoded.size)))[: pcm.size]
        entry.update({"lag": best, "snr_db": round(snr_db(pcm, aligned), 2), "max_abs_error": int(np.max(np.abs(aligned.astype(np.int32) - pcm)))})
    report["formats"][fmt] = entry

# Server-sent events: the deltas carry the PCM.
events = speak(voice="alloy", response_format="pcm", stream_format="sse")
body = events.content.decode()
deltas = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
audio = b"".join(__import__("base64").b64decode(e["audio"]) for e in deltas if e["type"] == "speech.audio.delta")
assert deltas[-1]["type"] == "speech.audio.done", deltas[-1]
assert np.array_equal(np.frombuffer(audio, dtype="<i2"), pcm), "SSE audio differs from the PCM"
report["sse_events"] = len(deltas)

# Custom voices by name: create, use by name and id, list, delete.
with open(recording, "rb") as sample:
    voice = client.audio.voices.create(name="sdk-narrator", audio_sample=sample, consent="cons_sdk")
assert voice.name == "sdk-narrator" and voice.object == "audio.voice", voice
by_name = speak(voice="sdk-narrator", response_format="pcm").content
assert by_name == speak(voice={"id": voice.id}, response_format="pcm").content, "name and id differ"
assert by_name != pcm.tobytes(), "the saved voice sounds like the default"
listed = client.get("/audio/voices", cast_to=object)
assert [v["name"] for v in listed["data"]] == ["sdk-narrator"], listed
deleted = client.audio.voices.delete(voice.id)
assert deleted.deleted and deleted.object == "audio.voice.deleted", deleted
try:
    speak(voice="sdk-narrator", response_format="pcm")
    raise AssertionError("a deleted voice was used")
except __import__("openai").BadRequestError as e:
    assert e.body["param"] == "voice", e.body
report["voice"] = {"id": voice.id, "name": voice.name, "deleted": deleted.deleted}
print(json.dumps(report))
