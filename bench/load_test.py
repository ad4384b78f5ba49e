"""Loopback load test of `drama serve`: C concurrent clients, R streamed requests each.

Reports time to first audio byte, total latency, audio produced and aggregate throughput
(seconds of audio per second of wall time). Standard library only.

    python3 bench/load_test.py --url http://127.0.0.1:8080 --clients 4 --requests 3 > load.json
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

parser = argparse.ArgumentParser()
parser.add_argument("--url", default="http://127.0.0.1:8080")
parser.add_argument("--clients", type=int, default=4)
parser.add_argument("--requests", type=int, default=3)
parser.add_argument("--max-audio-tokens", type=int, default=250)
args = parser.parse_args()
url = urllib.parse.urlparse(args.url)
results, errors, lock = [], [], threading.Lock()


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


wall = time.perf_counter()
threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - wall
audio = sum(r["audio_s"] for r in results)
print(json.dumps({
    "clients": args.clients, "requests_per_client": args.requests, "completed": len(results), "errors": errors,
    "wall_s": wall, "audio_s": audio, "audio_seconds_per_second": audio / wall,
    "ttfa_s_median": statistics.median(r["ttfa_s"] for r in results) if results else None,
    "latency_s_median": statistics.median(r["latency_s"] for r in results) if results else None,
    "latency_s_max": max(r["latency_s"] for r in results) if results else None,
    "requests": results,
}, indent=2))
