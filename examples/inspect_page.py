"""The inspect page on the demo's models, in one process: serves `make demo`'s
exports with the stand-in, opens the page over its history store and either
prints the address (open it; Ctrl-C stops) or, with --screenshot, loads one
user in headless Chromium, selects a candidate and writes a screenshot (the
one in docs/inspect.md: `make screenshots`).

    python examples/inspect_page.py [--work_dir=runs/demo] [--user=ID] [--screenshot=docs/figures/inspect.png]

The page itself is `python -m serving.inspect` (docs/inspect.md).
"""

import argparse
import os
import threading

from dare_tf.export import MODELS_CONFIG
from dare_tf.histories import open_store
from dare_tf.serving.inspect import Inspector, page_server
from dare_tf.testing.model_config import read_model_config
from dare_tf.testing.standin_server import serve


def longest_history(store, first: int = 200):
    """Of the store's first `first` users, the one with the most clicks."""
    users = [user for user, _ in zip(store.users(), range(first))]
    return max(users, key=lambda u: int(store.last([u]).lengths[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/demo", help="make demo's output directory (exports/, histories/)")
    parser.add_argument("--model_name", default="dare")
    parser.add_argument("--compare", default="twin")
    parser.add_argument("--user", help="the user to show (default: the longest history of the store's first 200)")
    parser.add_argument("--candidate", type=int, default=2, help="the recommendation selected in the screenshot")
    parser.add_argument("--screenshot", help="write a screenshot of the page here and exit")
    args = parser.parse_args()
    config = os.path.join(args.work_dir, "exports", MODELS_CONFIG)
    if not os.path.exists(config):
        raise SystemExit(f"error: {config} not found: run make demo first (or give --work_dir)")
    server, port, _ = serve(read_model_config(config), 0)
    store = open_store(f"lmdb:{os.path.join(args.work_dir, 'histories')}", read_only=True)
    inspector = Inspector.connect(f"localhost:{port}", args.model_name, store, compare=args.compare)
    page = page_server(inspector)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    user = args.user or longest_history(store)
    address = f"http://127.0.0.1:{page.server_port}/?user={user}"
    try:
        if not args.screenshot:
            print(f"open {address} (Ctrl-C stops)", flush=True)
            threading.Event().wait()
        from dare_tf.testing.browser import browser_missing, chromium_page

        missing = browser_missing()
        if missing:
            raise SystemExit(f"error: {missing}")
        with chromium_page(width=1400, height=1000) as browser:
            browser.goto(address)
            browser.wait_for_function("document.body.dataset.status !== undefined")
            if browser.evaluate("document.body.dataset.status") != "200":
                raise SystemExit(f"error: the page answered {browser.inner_text('#message')}")
            browser.click(f"#recommendations tbody tr[data-row='{args.candidate - 1}']")
            browser.wait_for_function(f"document.body.dataset.selected === '{args.candidate - 1}'")
            browser.wait_for_timeout(500)  # (Plotly's transitions)
            browser.screenshot(path=args.screenshot, full_page=True)
        print(f"wrote {args.screenshot}: user {user}, recommendation {args.candidate}")
    except KeyboardInterrupt:
        pass
    finally:
        page.shutdown()
        inspector.close()
        store.close()
        server.stop(0)


if __name__ == "__main__":
    main()
