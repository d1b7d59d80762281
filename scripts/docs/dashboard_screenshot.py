"""Screenshot TensorBoard's first screen (Time Series) over a log directory, in headless Chromium.

docs/dashboard.png was made with it, over a ``clip_b_tiny.yaml`` and a ``grpo_tiny.yaml`` fit of 30 batches
(``--trainer.limit_train_batches=30 --trainer.val_check_interval=5``)::

    python -m scripts.docs.dashboard_screenshot --logdir runs --out docs/dashboard.png

Needs ``pip install playwright`` and a Chromium (``python -m playwright install chromium``, or the system's,
given with ``--chromium /usr/bin/chromium``); neither is a dependency of lit_entropy.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time


def wait_for_port(port: int, seconds: float = 60.0) -> None:
    """Return once something listens on ``127.0.0.1:port``; raise after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"TensorBoard did not answer on port {port} within {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--out", default="docs/dashboard.png")
    parser.add_argument("--tab", default="timeseries", help="TensorBoard tab: timeseries, custom_scalars, hparams")
    parser.add_argument("--port", type=int, default=6123)
    parser.add_argument("--chromium", default=None, help="a Chromium executable (default: playwright's own)")
    parser.add_argument("--width", type=int, default=1680)
    parser.add_argument("--height", type=int, default=1050)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    command = [sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--port", str(args.port)]
    board = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(args.port)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(f"http://127.0.0.1:{args.port}/#{args.tab}")
            time.sleep(8)  # the cards load their data asynchronously
            close = page.locator("button[aria-label='Close side pane']")  # Time Series' settings pane
            if close.count():
                close.first.click()
                time.sleep(2)
            page.screenshot(path=args.out)
            browser.close()
    finally:
        board.terminate()
        board.wait()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
