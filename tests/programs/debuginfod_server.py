#!/usr/bin/env python3
"""A debuginfod server for tests: the protocol's one request witch makes,
GET /buildid/<hex>/debuginfo, answered from DIR/<hex>.debug (404 when there is
none), on 127.0.0.1 at a port the system picks. It prints the port on its
first line, then one line per request ("<status> <path>"), flushed, so a test
can count what was asked. It stops after LIFETIME seconds whatever happens, so
a test that fails cannot leave it behind for long.

    debuginfod_server.py DIR [LIFETIME]
"""
import http.server
import os
import re
import sys
import threading

ROOT = sys.argv[1]
LIFETIME = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
PATH = re.compile(r"^/buildid/([0-9a-f]+)/debuginfo$")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        m = PATH.match(self.path)
        file = os.path.join(ROOT, m.group(1) + ".debug") if m else None
        if file is None or not os.path.isfile(file):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            print(404, self.path, flush=True)
            return
        with open(file, "rb") as f:
            data = f.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        print(200, self.path, flush=True)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
threading.Timer(LIFETIME, server.shutdown).start()
server.serve_forever()
