"""See why: a page on localhost over the calls `recommend` makes.

For one user it shows the lifelong history from the history service as a
timeline, the recommended items (retrieval rank, ranker probability, the source
that proposed each), and, for a selected candidate, the behaviours the ranker's
search kept (`rank_explain`'s `history_index`), highlighted on the timeline,
with their attention weights; with `compare`, a second ranker on the same
history and candidates beside the first. The page reads; it never writes to the
store, and every load reads the store again (a click appended a moment ago
shows up on reload).

The application (Flask) answers:

- `GET /`: the page (`?user=ID` loads that user);
- `GET /api/users/<id>`: the page's data as JSON (`user_view`), or
  `{"error": "..."}` with an HTTP status a script can read: 400 (not a user
  id), 404 (the store holds no clicks of the user), 502 (a model is not
  served, lacks `rank_explain`, or the models were exported from different
  datasets), 503 (the model server or the history store does not answer).

Program: `python -m serving.inspect` (serving/inspect.py). Library:

    app = create_app(Inspector.connect(target, "dare", store, compare="twin"))
"""

from __future__ import annotations

import os
import time

import grpc
import numpy as np

from dare_tf.serving.encoding import TooManyCandidates
from dare_tf.serving.page_server import PAGE_REQUEST_TIMEOUT_S, PAGE_WORKERS
from dare_tf.signatures import RANK_EXPLAIN

# How many candidates the page lists (the rankers score all the retrieval model returns).
SHOWN = 20


def _int64(user: str) -> int:
    """A user id typed into the page, as a store of integer ids keys it."""
    try:
        user_id = int(user)
        if -(2**63) <= user_id < 2**63:
            return user_id
    except ValueError:
        pass
    raise PageError(400, f"user id {user!r} is not an integer id (the history store's ids are int64)")


def _string_id(user: str) -> str:
    """A user id typed into the page, as a store of string ids keys it."""
    from dare_tf.data.logs.string_ids import id_problem

    problem = id_problem(user)
    if problem:
        raise PageError(400, f"user id {user!r} {problem}")
    return user


class PageError(Exception):
    """A request the page answers with `message` and HTTP `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# Attention "near uniform": every kept behaviour's weight within this share of 1/K.
NEAR_UNIFORM = 0.25


def near_uniform(model_name: str, rows: list[dict]) -> str | None:
    """The page's note where the first ranker's attention over the kept behaviours of its
    first recommendation (`rows`, `_view`'s) is near uniform: a model that tells them
    little apart (an undertrained one's attention is); None otherwise."""
    kept = rows[0]["rankers"][0]["kept"] if rows else []
    if len(kept) < 2 or max(abs(k["weight"] * len(kept) - 1) for k in kept) > NEAR_UNIFORM:
        return None
    return (f"the ranker {model_name!r}'s attention over the {len(kept)} behaviours it kept is near uniform (every "
            f"weight within {NEAR_UNIFORM:.0%} of 1/{len(kept)}): it tells them little apart, as an undertrained "
            "model does")


class Inspector:
    """What the page shows, read through the same client calls as `recommend`.

    Args:
        retrieval: the retrieval model, as a `ServingClient` or `LocalModel`
            (`predict_tensors` and `model_name`).
        rankers: one ranker, or two (the second shown beside the first), the
            same way.
        histories: an open history store (`dare_tf.histories.open_store`,
            read-only).
        target: the model server's address, for messages.

    `Inspector.connect` builds one over a model server's gRPC address.
    """

    def __init__(self, retrieval, rankers: list, histories, target: str = ""):
        from dare_tf.serving.recommender import Recommender

        if not 1 <= len(rankers) <= 2:
            raise ValueError(f"one ranker, or two to compare; got {len(rankers)}")
        self.target, self.histories, self.clients = target, histories, [retrieval, *rankers]
        self.names = [ranker.model_name for ranker in rankers]
        self.recommenders = [Recommender(retrieval, ranker, histories) for ranker in rankers]

    @classmethod
    def connect(cls, target: str, model_name: str, histories, retrieval_model: str = "retrieval",
                compare: str | None = None, timeout: float = 5.0) -> "Inspector":
        """An inspector over the models served at `target` (`host:port`, gRPC: TF
        Serving or the stand-in): the ranker `model_name`, the retrieval model
        `retrieval_model` and, with `compare`, a second ranker; `timeout`:
        seconds per call (no retries: the page says at once that a server is
        down)."""
        from dare_tf.serving.client import ServingClient

        names = [retrieval_model, model_name] + ([compare] if compare else [])
        clients = [ServingClient(target, name, timeout=timeout, retries=0) for name in names]
        return cls(clients[0], clients[1:], histories, target)

    def close(self) -> None:
        for client in self.clients:
            if hasattr(client, "close"):
                client.close()

    def user_view(self, user: str, n: int | None = None, top: int = SHOWN, now: int | None = None) -> dict:
        """The page's data for user id `user` (a string, as typed): `history`
        (`items`, `categories`, `times` oldest first), `models` (the rankers'
        names) and `recommendations`, the first ranker's `top` of the retrieval
        model's first `n` candidates (default: all it returns), each with `item`, `category`, `retrieval_rank`,
        `retrieval_score`, `source` and per ranker (`rankers`, in `models`'
        order) its `probability`, `place` among the `n` (1 = its first) and `kept`: the kept
        behaviours as `{"index": i, "weight": w}`, heaviest first (`i` indexes
        `history`). Raises `PageError`."""
        user_id = _string_id(user) if getattr(self.histories, "string_ids", False) else _int64(user)
        try:
            history = self.histories.last([user_id])
        except Exception as e:  # (LMDB and Redis raise their own kinds)
            raise PageError(503, f"the history store {self.histories.url} did not answer: {e}") from e
        if history.lengths[0] == 0:
            raise PageError(404, f"the history store {self.histories.url} holds no clicks of user {user_id}")
        now = int(time.time()) if now is None else now
        try:
            answers = self._rank(history, n, now)
        except grpc.RpcError as e:
            raise self._serving_error(e) from e
        except TooManyCandidates as e:  # (the caller's n)
            raise PageError(400, str(e)) from e
        except ValueError as e:  # (a model not served, exported from another dataset, or a refused row)
            raise PageError(502, str(e)) from e
        return self._view(user_id, history, answers, top)

    def _rank(self, history, n: int | None, now: int) -> tuple[dict, list[dict]]:
        first = self.recommenders[0]
        items, categories, fields = first.history_inputs(history, now)
        retrieved = first.retrieve(items, categories, n)
        ranked = [first.rank(items, categories, retrieved, fields, explain=True)]
        for other in self.recommenders[1:]:
            _, _, own_fields = other.history_inputs(history, now)
            ranked.append(other.rank(items, categories, retrieved, own_fields, explain=True))
        return retrieved, ranked, first.unknown_clicks(items, categories)

    def _view(self, user_id: int, history, answers, top: int) -> dict:
        from dare_tf.serving.encoding import notes_line, vocabulary_line

        retrieved, ranked, unknown = answers
        length = int(history.lengths[0])
        orders = [np.argsort(-r["probability"], kind="stable") for r in ranked]
        places = []  # each ranker's rank (1 = first) of every candidate
        for order in orders:
            place = np.empty(len(order), np.int64)
            place[order] = np.arange(1, len(order) + 1)
            places.append(place)
        rows = []
        plain = (lambda v: v) if self.recommenders[0].strings else int
        for c in orders[0][:top]:
            rankers = []
            for r, place in zip(ranked, places):
                index, weight = r["history_index"][c], r["attention_weight"][c]
                kept = sorted(({"index": int(i), "weight": float(w)} for i, w in zip(index, weight) if i >= 0),
                              key=lambda k: -k["weight"])
                rankers.append({"probability": float(r["probability"][c]), "place": int(place[c]), "kept": kept})
            rows.append({"item": plain(retrieved["items"][c]), "category": plain(retrieved["categories"][c]),
                         "retrieval_rank": int(c) + 1, "retrieval_score": float(retrieved["scores"][c]),
                         "source": str(retrieved["sources"][c]) if "sources" in retrieved else "unknown",
                         "rankers": rankers})
        return {"user": str(user_id), "models": self.names, "candidates": len(retrieved["items"]),
                "history": {"items": history.items[0, :length].tolist(),
                            "categories": history.categories[0, :length].tolist(),
                            "times": history.times[0, :length].tolist()},
                "recommendations": rows, "unknown": vocabulary_line(unknown),
                "notes": [n for n in (notes_line(self.names[0], self.recommenders[0].notes),
                                      near_uniform(self.names[0], rows)) if n]}

    def _serving_error(self, e: grpc.RpcError) -> PageError:
        details = e.details() or ""
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return PageError(503, f"the model server {self.target} does not answer ({e.code().name}): start it, "
                                  "or check --server")
        if RANK_EXPLAIN in details:
            return PageError(502, f"a ranker of {self.names} has no {RANK_EXPLAIN!r} signature: export it again "
                                  "with this version (python -m serving.export)")
        return PageError(502, f"the model server {self.target} refused the request ({e.code().name}): {details}")


def create_app(inspector: Inspector):
    """The Flask application of the page over `inspector`."""
    from flask import Flask, jsonify, render_template, request, send_file

    here = os.path.dirname(os.path.abspath(__file__))
    app = Flask(__name__, template_folder=os.path.join(here, "templates"),
                static_folder=os.path.join(here, "static"))

    @app.get("/")
    def page():
        return render_template("inspect.html", models=inspector.names, target=inspector.target,
                               store=inspector.histories.url)

    @app.get("/plotly.min.js")
    def plotly_js():
        import plotly

        return send_file(os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js"),
                         mimetype="text/javascript", max_age=3600)

    @app.get("/favicon.ico")
    def favicon():
        return "", 204

    @app.errorhandler(404)
    def not_found(error):  # (JSON under /api/, as the page's script reads it; werkzeug's HTML elsewhere)
        if request.path.startswith("/api/"):
            return jsonify({"error": f"no such address: {request.path} (the page's data is at /api/users/<id>)"}), 404
        return error

    @app.get("/api/users/<path:user>")  # (any id: `dept/123` arrives as dept%2F123, decoded with its slash)
    def user_data(user):
        try:
            n = request.args.get("n", None, type=int)
            top = request.args.get("top", SHOWN, type=int)
            if (n is not None and n < 1) or top < 1:
                raise PageError(400, f"n={n}, top={top}: both must be >= 1")
            return jsonify(inspector.user_view(user, n, top))
        except PageError as e:
            return jsonify({"error": e.message}), e.status

    return app


def page_server(inspector: Inspector, host: str = "127.0.0.1", port: int = 0, workers: int = PAGE_WORKERS,
                request_timeout_s: float = PAGE_REQUEST_TIMEOUT_S):
    """The page's WSGI server (werkzeug's; `serve_forever()` runs it, `server_port`
    is its port, `server_close()` stops its workers), without werkzeug's line per
    request: at most `workers` connections are served at once (the others wait
    in a queue, holding no thread), and a connection whose request has not been
    read `request_timeout_s` seconds after it was accepted is dropped."""
    from dare_tf.serving.page_server import pooled_server

    return pooled_server(create_app(inspector), host, port, workers, request_timeout_s)
