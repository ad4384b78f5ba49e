"""Loopback load test of `drama serve`: C concurrent clients, R streamed requests each.

Reports time to first audio byte, total latency, audio produced and aggregate throughput
(seconds of audio per second of wall time). With --voice-uploads N, one more client uploads
a 60 s reference recording N times in a row meanwhile (POST /v1/voices), and the report adds
each upload's status and latency (the throughput counts the speech clients' time only). Standard library only.

    python3 bench/load_test.py --url http://127.0.0.1:8080 --clients 4 --requests 3 > load.json
"""
import argparse
import http.client
import io
import json
import math
import statistics
import struct
import threading
import time
import urllib.parse
import wave

parser = argparse.ArgumentParser()
parser.add_argument("--url", default="http://127.0.0.1:8080")
parser.add_argument("--clients", type=int, default=4)
parser.add_argument("--requests", type=int, default=3)
parser.add_argument("--max-audio-tokens", type=int, default=250)
parser.add_argument("--voice-uploads", type=int, default=0)
args = parser.parse_args()
url = urllib.parse.urlparse(args.url)
results, errors, uploads, lock = [], [], [], threading.Lock()


def reference_wav(seconds=60, rate=24000):
    """A 16-bit mono WAV of two detuned tones."""
    frames = b"".join(
        struct.pack("<h", int(8000 * (math.sin(i * 0.031) + 0.5 * math.sin(i * 0.0123))))
        for i in range(seconds * rate))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return out.getvalue()


def uploader(wav):
    for _ in range(args.voice_uploads):
        start = time.perf_counter()
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        conn.request("POST", "/v1/voices", wav, {"content-type": "audio/wav"})
        response = conn.getresponse()
        response.read()
        with lock:
            uploads.append({"status": response.status, "latency_s": time.perf_counter() - start})
        conn.close()


def client(index):
    for r in range(args.requests):
        body = json.dumps({
            "model": "drama-3", "input": "Load test sentence number %d from client %d." % (r, index),
            "seed": index * 1000 + r, "stream_format": "audio", "response_format": "pcm",
            "max_audio_tokens": args.max_audio_tokens,
        })
        start = time.perf_counter()
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        conn.request("POST", "/v1/audio/speech", body, {"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            with lock:
                errors.append(response.status)
            continue
        rate = int(response.getheader("x-drama-sample-rate"))
        first, total = None, 0
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            if first is None:
                first = time.perf_counter() - start
            total += len(chunk)
        with lock:
            results.append({"ttfa_s": first, "latency_s": time.perf_counter() - start, "audio_s": total / 2 / rate})
        conn.close()


wav = reference_wav() if args.voice_uploads else None
wall = time.perf_counter()
threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
upload_thread = threading.Thread(target=uploader, args=(wav,))
for t in threads + [upload_thread]:
    t.start()
for t in threads:
    t.join()
# The speech clients' wall time: uploads still running after them do not dilute it.
wall = time.perf_counter() - wall
upload_thread.join()
audio = sum(r["audio_s"] for r in results)
print(json.dumps({
    "clients": args.clients, "requests_per_client": args.requests, "completed": len(results), "errors": errors,
    "wall_s": wall, "audio_s": audio, "audio_seconds_per_second": audio / wall,
    "ttfa_s_median": statistics.median(r["ttfa_s"] for r in results) if results else None,
    "latency_s_median": statistics.median(r["latency_s"] for r in results) if results else None,
    "latency_s_max": max(r["latency_s"] for r in results) if results else None,
    "voice_uploads": uploads,
    "requests": results,
}, indent=2))
