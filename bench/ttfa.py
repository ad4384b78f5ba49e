"""Time to first audio through `drama serve` as the input grows: for inputs of each sentence
count, the median seconds from sending a streamed request (raw PCM) to reading its first
audio bytes, over several requests, one at a time. The connection is closed after the first
bytes, which the server counts as a cancellation, so a long input costs only its start.

Usage: python3 bench/ttfa.py --url http://127.0.0.1:8080 --sentences 1,10,100,250 --out ttfa.json"""

import argparse
import http.client
import json
import statistics
import time
import urllib.parse

parser = argparse.ArgumentParser()
parser.add_argument("--url", required=True, help="the server's base URL")
parser.add_argument("--sentences", default="1,10,100,250", help="sentence counts, comma-separated (250: about the 20 000 characters `drama serve` takes by default)")
parser.add_argument("--repeats", type=int, default=5, help="requests per sentence count")
parser.add_argument("--out", required=True, help="JSON results file")
args = parser.parse_args()
address = urllib.parse.urlparse(args.url)


def sentence(i):
    return f"Sentence number {i} of this request says a few plain words about the weather."


def first_audio(text, seed):
    """Seconds from sending the request to its first audio bytes."""
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=600)
    body = json.dumps(
        {"model": "drama-3", "input": text, "seed": seed, "response_format": "pcm", "stream_format": "audio"}
    )
    start = time.perf_counter()
    connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise SystemExit(f"{response.status}: {response.read()[:300]!r}")
    if not response.read1(65536):
        raise SystemExit("the stream ended without audio")
    seconds = time.perf_counter() - start
    connection.close()
    return seconds


results = []
for count in [int(n) for n in args.sentences.split(",")]:
    text = " ".join(sentence(i) for i in range(count))
    first_audio(text, 0)  # warm: this input length's step shapes compiled once
    times = [first_audio(text, seed) for seed in range(1, args.repeats + 1)]
    results.append({"sentences": count, "characters": len(text), "ttfa_s": times, "ttfa_s_median": statistics.median(times)})
    print(f"{count} sentences: time to first audio {statistics.median(times):.3f} s (median of {len(times)})")
json.dump({"url": args.url, "results": results}, open(args.out, "w"), indent=1)
