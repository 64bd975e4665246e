#!/usr/bin/env python3
"""A small HTTP store for the quickstart: PUT writes the body to a file under DIR (the
request's path), GET reads it back, DELETE removes it. It compares no tokens and
trusts every write, as most storage does: that is what the fence in front of it is for.

    file_store.py DIR PORT_FILE   # listens on 127.0.0.1, on a port it picks, written to PORT_FILE
"""
import http.server
import os
import sys

ROOT = os.path.abspath(sys.argv[1])


class Store(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def file(self):
        path = os.path.normpath(os.path.join(ROOT, self.path.split("?", 1)[0].lstrip("/")))
        return path if path.startswith(ROOT + os.sep) else None

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        path = self.file()
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if path is None:
            return self.answer(400)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        created = not os.path.exists(path)
        with open(path, "wb") as f:
            f.write(body)
        self.answer(201 if created else 204)

    def do_GET(self):
        path = self.file()
        if path is None or not os.path.isfile(path):
            return self.answer(404)
        with open(path, "rb") as f:
            self.answer(200, f.read())

    def do_DELETE(self):
        path = self.file()
        if path is None or not os.path.isfile(path):
            return self.answer(404)
        os.remove(path)
        self.answer(204)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Store)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
