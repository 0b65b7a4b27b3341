"""dare_tf.testing.rest: the stand-in's REST front answers every hostile body in one line and
never reads a body as the next request."""

import os
import threading

import pytest

from tests.served import raw_maps


@pytest.mark.xdist_group("serving_setup")
def test_rest_answers_every_hostile_body(setup):
    import http.client
    import json

    port = int(setup["rest"].rsplit(":", 1)[1])

    def post(path, body: bytes, length=None):
        connection = http.client.HTTPConnection("localhost", port, timeout=30)
        connection.putrequest("POST", path)
        connection.putheader("Content-Length", str(len(body) if length is None else length))
        connection.endheaders()
        connection.send(body)
        response = connection.getresponse()
        answer = response.status, json.loads(response.read())["error" if response.status != 200 else "outputs"]
        connection.close()
        return answer

    path = "/v1/models/dare:predict"
    good = {"target_item": [1], "target_category": [1], "hist_items": [[3]], "hist_categories": [[1]]}
    assert post(path, json.dumps({"inputs": good}).encode())[0] == 200
    assert post("/v1/models/dare/versions/1:predict", json.dumps({"inputs": good}).encode())[0] == 200
    cases = {
        b"[1, 2]": (400, "malformed request: the body must be a JSON object, not list"),
        b"7": (400, "malformed request: the body must be a JSON object, not int"),
        b"[" * 100_000 + b"]" * 100_000: (400, "malformed request: the body is not JSON (RecursionError)"),
        json.dumps({"inputs": [1, 2]}).encode():
            (400, "malformed request: 'inputs' must be an object naming each input of 'serving_default': "
                  "['hist_categories', 'hist_items', 'target_category', 'target_item']"),
        json.dumps({"instances": 3}).encode(): (400, "malformed request: 'instances' must be a non-empty list"),
        json.dumps({"inputs": dict(good, extra=[1])}).encode():
            (400, "malformed request: unknown inputs ['extra']; 'serving_default' takes "
                  "['hist_categories', 'hist_items', 'target_category', 'target_item']"),
    }
    for body, (code, message) in cases.items():
        assert post(path, body) == (code, message), body[:40]
    code, message = post("/v1/models/dare/versions/99:predict", json.dumps({"inputs": good}).encode())
    assert code == 404 and message.startswith("Servable not found for request: Specific(dare, 99)")
    code, message = post(path, b"{}", length=100 << 20)  # a claimed 100 MB body is not read
    assert (code, message) == (413, "a body of 104,857,600 bytes is over the server's max_request_bytes of "
                                     "67,108,864")
    # the dataset signature over REST: string outputs come back as JSON strings
    items, _ = raw_maps(setup["data_dir"])
    code, outputs = post(path, json.dumps({"signature_name": "dataset", "inputs": {"item_ids": [next(iter(items)), -5]}}
                                          ).encode())
    assert code == 200 and outputs["known"] == [True, False] and isinstance(outputs["id_maps"][0], str)
    assert post(path, json.dumps({"inputs": good}).encode())[0] == 200  # the server lives on


@pytest.mark.xdist_group("serving_setup")
def test_rest_never_reads_a_body_as_the_next_request_and_bounds_its_workers(setup):
    """A request hidden in the body of a 404'd request is never run, and the next good
    request on the kept-alive connection is answered; chunked bodies are refused with
    the connection closed; GET is the model's status; when every REST worker is busy
    a request waits its timeout, then gets 503."""
    import json
    import socket

    from dare_tf.testing.requests import Limits
    from dare_tf.testing.rest import RestHandler
    from dare_tf.testing.loaded_model import LoadedModel
    from dare_tf.testing.standin_server import _HTTPServer

    port = int(setup["rest"].rsplit(":", 1)[1])
    good = json.dumps({"inputs": {"target_item": [1], "target_category": [1], "hist_items": [[-2, 3]],
                                  "hist_categories": [[-2, 1]]}}).encode()

    def request(method, path, body=b"", headers=()):
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{h}\r\n" for h in headers)
        return (head + (f"Content-Length: {len(body)}\r\n" if not headers else "") + "\r\n").encode() + body

    def answers(raw: bytes, expected: int) -> list[tuple[int, dict]]:
        """Sends `raw` on one connection and reads `expected` answers (fewer if it
        closes), then checks that nothing more comes."""
        with socket.create_connection(("localhost", port), timeout=30) as sock:
            sock.sendall(raw)
            reader, out = sock.makefile("rb"), []
            for _ in range(expected):
                status = reader.readline()
                if not status:
                    return out
                headers = {}
                while (line := reader.readline().strip()):
                    key, _, value = line.decode().partition(":")
                    headers[key.lower()] = value.strip()
                out.append((int(status.split()[1]), json.loads(reader.read(int(headers["content-length"])))))
            sock.settimeout(0.5)
            try:
                assert not sock.recv(1), "an answer more than the requests sent"
            except TimeoutError:
                pass
            return out

    smuggled = request("POST", "/v1/models/dare:predict", good)
    got = answers(request("POST", "/v1/models/nope:predict", smuggled) + request("POST", "/v1/models/dare:predict",
                                                                                 good), 2)
    assert [code for code, _ in got] == [404, 200], got  # the hidden request was a body, not a request
    got = answers(request("POST", "/v1/models/dare/versions/99:predict", smuggled) + request(
        "POST", "/v1/models/dare:predict", good), 2)
    assert [code for code, _ in got] == [404, 200], got
    got = answers(request("POST", "/v1/models/dare:predict", b"5\r\nhello\r\n0\r\n\r\n" + smuggled,
                          headers=("Transfer-Encoding: chunked",)), 1)
    assert got == [(411, {"error": "a body needs a Content-Length (chunked bodies are not taken)"})], got
    # Issue 45 (9): two different Content-Lengths (the first won): 400, the connection closed (RFC 9112 6.3).
    got = answers(request("POST", "/v1/models/dare:predict", good + smuggled, headers=(
        f"Content-Length: {len(good)}", f"Content-Length: {len(good) + len(smuggled)}")), 2)
    assert got == [(400, {"error": f"Content-Length is given more than once, differently ({len(good)}, "
                                   f"{len(good) + len(smuggled)})"})], got
    got = answers(request("POST", "/v1/models/dare:predict", good, headers=(
        f"Content-Length: {len(good)}", f"Content-Length: {len(good)}")), 1)  # the same twice: one length
    assert [code for code, _ in got] == [200], got
    got = answers(request("GET", "/v1/models/dare") + request("GET", "/v1/models/dare/versions/7") +
                  request("DELETE", "/v1/models/dare"), 3)
    assert got[0] == (200, {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                                      "status": {"error_code": "OK", "error_message": ""}}]})
    assert got[1][0] == 404 and got[2][0] == 501 and "error" in got[2][1], got
    # every worker busy: the next request waits the timeout, then 503, its body unread
    limits = Limits(rest_workers=1, request_timeout_s=0.3)
    workers = threading.BoundedSemaphore(1)
    handler = type("Handler", (RestHandler,), {"models": {"dare": LoadedModel(os.path.dirname(setup["path"]), "dare")},
                                               "limits": limits, "workers": workers})
    server = _HTTPServer(("localhost", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        workers.acquire()  # the one worker is taken
        got = answers(request("POST", "/v1/models/dare:predict", good), 1)
        assert got == [(503, {"error": "no REST worker free within 0.3 s (1 at once); retry later"})], got
        workers.release()
        assert answers(request("POST", "/v1/models/dare:predict", good), 1)[0][0] == 200
    finally:
        server.shutdown()
