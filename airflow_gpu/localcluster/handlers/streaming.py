"""Streaming responses: watches (chunked JSON lines) and pod logs (chunked text)."""

from __future__ import annotations

import asyncio

from airflow_gpu.localcluster.handlers import discovery
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.errors import ApiError
from airflow_gpu.localcluster.handlers.httpio import JSON, TRUE, Request
from airflow_gpu.localcluster.registry.resources import ResourceType
from airflow_gpu.localcluster.registry.selectors import parse_field_selector, parse_label_selector
from airflow_gpu.localcluster.registry.store import Store, encode


async def stream_watch(store: Store, req: Request, send, rt: ResourceType, version: str, namespace: str | None,
                       bookmark_seconds: float, tasks_registry: set) -> None:
    """A watch: chunked newline-delimited events, BOOKMARKs, the end at timeoutSeconds or disconnect."""
    lreqs = parse_label_selector(req.query.get("labelSelector"))
    freqs = parse_field_selector(req.query.get("fieldSelector"), rt.kind)
    rv_text = req.query.get("resourceVersion", "")
    send_initial = req.query.get("sendInitialEvents") in TRUE
    bookmarks = req.query.get("allowWatchBookmarks") in TRUE
    timeout = float(req.query.get("timeoutSeconds") or 1800)
    table = "as=Table" in req.headers.get("accept", "")
    await send({"type": "http.response.start", "status": 200, "headers": JSON})
    try:
        since = int(rv_text) if rv_text not in ("", "0") and not send_initial else None
    except ValueError:
        since = -1
    try:
        if since == -1:
            raise errors.bad_request(f'resourceVersion "{rv_text}" is not a number; send one from a list or watch')
        initial = store.entries(rt.key, namespace) if since is None else None
        watcher = store.watch(rt.key, namespace, lreqs, freqs, since, initial)
    except ApiError as exc:
        line = encode({"type": "ERROR", "object": exc.status()}) + b"\n"
        await send({"type": "http.response.body", "body": line})
        await send({"type": "http.response.body", "body": b""})
        return
    if send_initial:
        watcher.queue.put_nowait(("BOOKMARK", store.rv, True))
    api_version = rt.api_version(version)
    convert = rt.crd and version != rt.versions[0]

    async def ticker():
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            wait = min(bookmark_seconds, end - loop.time()) if bookmarks else end - loop.time()
            if wait <= 0:
                watcher.close()
                return
            await asyncio.sleep(wait)
            if bookmarks and loop.time() < end:
                watcher.queue.put_nowait(("BOOKMARK", store.rv, False))

    async def disconnect():
        while True:
            message = await req.receive()
            if message["type"] == "http.disconnect":
                watcher.close()
                return

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(disconnect())]
    tasks_registry.update(tasks)
    first_table = True
    try:
        while True:
            item = await watcher.queue.get()
            batch = [item]
            while not watcher.queue.empty() and len(batch) < 500:
                batch.append(watcher.queue.get_nowait())
            lines = []
            done = False
            for item in batch:
                if item is None:
                    done = True
                    break
                etype = item[0]
                if etype == "BOOKMARK":
                    meta = {"resourceVersion": str(item[1])}
                    if item[2]:
                        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
                    lines.append(encode({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": api_version,
                                                                         "metadata": meta}}))
                    continue
                entry = item[1]
                if table:
                    t = discovery.to_table(rt, version, [entry.obj], entry.obj["metadata"]["resourceVersion"],
                                           req.query.get("includeObject", "Metadata"), with_columns=first_table)
                    first_table = False
                    lines.append(encode({"type": etype, "object": t}))
                elif convert:
                    lines.append(encode({"type": etype, "object": {**entry.obj, "apiVersion": api_version}}))
                else:
                    lines.append(b'{"type":"' + etype.encode() + b'","object":' + entry.raw + b"}")
            if lines:
                await send({"type": "http.response.body", "body": b"\n".join(lines) + b"\n", "more_body": True})
            if done:
                break
        await send({"type": "http.response.body", "body": b""})
    except OSError:
        pass
    finally:
        watcher.close()
        for task in tasks:
            task.cancel()
            tasks_registry.discard(task)


async def stream_log(stream, send, receive=None) -> None:
    """A pod log as a chunked text/plain response (kept open while following, until the container ends
    or the client goes: `receive` tells of the disconnect, as for a watch; a followed log would
    otherwise be read on the server until its container ended)."""
    first = await anext(stream, None)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})

    async def body() -> None:
        chunk = first
        while chunk is not None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await anext(stream, None)
        await send({"type": "http.response.body", "body": b""})

    async def disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    sending = asyncio.ensure_future(body())
    gone = asyncio.ensure_future(disconnect()) if receive is not None else None
    try:
        await asyncio.wait([t for t in (sending, gone) if t is not None], return_when=asyncio.FIRST_COMPLETED)
        if sending.done():
            sending.result()
    except OSError:
        pass
    finally:
        for task in (sending, gone):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (sending, gone) if t is not None), return_exceptions=True)
        await stream.aclose()
    return None
