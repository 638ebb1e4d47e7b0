#!/usr/bin/env python3
"""fake_ollama.py: a tiny stand-in for Ollama's POST /api/generate, used only by
tests/test_corpus.c. It binds 127.0.0.1 (never any other address) on an ephemeral port,
prints that port on stdout, serves until killed, and exits by itself after --lifetime
seconds so a crashed test cannot leave it behind.

The model name picks the behaviour:
  http500     -> HTTP 500 {"error": "..."}
  missing     -> HTTP 404 {"error": "model 'missing' not found ..."} (what Ollama says)
  badjson     -> HTTP 200 with a body that is not JSON
  noresponse  -> HTTP 200 JSON without "response"
  anything else -> HTTP 200 {"response": "Synthetic document <seed> for prompt: <prompt>\\r\\n..."}
"""
import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/api/generate":
            return self.reply(404, {"error": "no such endpoint " + self.path})
        n = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(n))
        except ValueError:
            return self.reply(400, {"error": "request is not JSON"})
        if req.get("stream") is not False:
            return self.reply(400, {"error": "this fake only answers stream=false"})
        model, prompt = req.get("model"), req.get("prompt")
        if not isinstance(model, str) or not isinstance(prompt, str):
            return self.reply(400, {"error": "model and prompt must be strings"})
        if model == "http500":
            return self.reply(500, {"error": "boom: the model runner crashed"})
        if model == "missing":
            return self.reply(404, {"error": "model 'missing' not found, try pulling it first"})
        if model == "badjson":
            return self.reply(200, "this is not json {")
        if model == "noresponse":
            return self.reply(200, {"model": model, "done": True})
        seed = (req.get("options") or {}).get("seed")
        text = "Synthetic document %s for prompt: %s\r\nSecond line." % (seed, prompt)
        return self.reply(200, {"model": model, "response": text, "done": True})

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lifetime", type=float, default=60.0)
    args = ap.parse_args()
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Timer(args.lifetime, lambda: os._exit(0)).start()
    print(server.server_address[1], flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
