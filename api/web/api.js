// The dashboard's only way to the API: fetch() with the session's key in `Authorization: Bearer`, never in a URL.
// EventSource cannot send that header, so the live event stream is read from a fetch() body and its SSE frames
// are parsed here; a dropped stream resumes with Last-Event-ID (the last seq seen), so no event is lost or repeated.

const KEY = "benchwright.apiKey";
const TERMINAL = "PipelineFinished";

export const auth = {
  get: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${auth.get() ?? ""}`, ...extra };
}

async function failure(resp) {
  const body = await resp.json().catch(() => null);
  const err = body && body.error ? body.error : {};
  const detail = body && Array.isArray(body.detail) ? body.detail.map((d) => d.msg).join("; ") : null;
  return new ApiError(resp.status, err.code ?? `http_${resp.status}`, err.message ?? detail ?? resp.statusText);
}

function signedOut() {
  auth.clear();
  if (!location.hash.startsWith("#/signin")) location.hash = "#/signin";
}

/** JSON call to the API; a 401 drops the key and goes back to the sign-in page. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    signedOut();
    throw await failure(resp);
  }
  if (!resp.ok) throw await failure(resp);
  return resp.status === 204 ? null : resp.json();
}

function parseFrame(frame) {
  let id = null;
  let type = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (line === "" || line.startsWith(":")) continue; // keep-alive comments
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { id, type, data: data.join("\n") } : null;
}

const pause = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});

/**
 * Follow a run's event log from its start until its terminal event. `onEvents(list)` gets each chunk's events
 * (parsed EventViews, in seq order) at once; `onState("live" | "reconnecting" | "done")` tells the connection's
 * state. Resolves when the terminal event has arrived or `signal` aborts.
 */
export function followEvents(runId, handlers) {
  return followLog(`/v1/runs/${encodeURIComponent(runId)}/events`, TERMINAL, handlers);
}

/** The same for an Operator session's log, which ends with SessionAnswered. */
export function followSession(sessionId, handlers) {
  return followLog(`/v1/operator/sessions/${encodeURIComponent(sessionId)}/events`, "SessionAnswered", handlers);
}

/**
 * Save a file the API serves (a run's report) under `name`: fetched with the key (a plain link could not send it),
 * handed to the browser as a download. Resolves to the bytes' size.
 */
export async function download(path, name) {
  const resp = await fetch(path, { headers: headers() });
  if (resp.status === 401) { signedOut(); throw await failure(resp); }
  if (!resp.ok) throw await failure(resp);
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  const a = Object.assign(document.createElement("a"), { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return blob.size;
}

/** `over()` (optional) is asked when a stream closes before the terminal event: true ends the follow (a session
 * that failed before it could answer has no terminal event). */
async function followLog(path, terminalType, { onEvents, onState, signal, over }) {
  let last = -1;
  let backoff = 500;
  while (!signal.aborted) {
    let terminal = false;
    try {
      const resp = await fetch(path, {
        signal, headers: headers({ Accept: "text/event-stream", "Last-Event-ID": String(last) }),
      });
      if (resp.status === 401) { signedOut(); return; }
      if (resp.status === 404) throw await failure(resp);
      if (!resp.ok) throw new ApiError(resp.status, "stream", `event stream answered ${resp.status}`);
      onState("live");
      backoff = 500;
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        const batch = [];
        let start = 0;
        let end;
        // One slice per chunk, not per frame: a catch-up chunk holds hundreds of frames.
        while ((end = buffer.indexOf("\n\n", start)) >= 0) {
          const frame = parseFrame(buffer.slice(start, end));
          start = end + 2;
          if (!frame) continue;
          const event = JSON.parse(frame.data);
          last = frame.id !== null ? Number(frame.id) : event.seq;
          batch.push(event);
          if (event.type === terminalType) terminal = true;
        }
        buffer = buffer.slice(start);
        if (batch.length) onEvents(batch);
      }
      if (terminal || (over && await over())) { onState("done"); return; }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status === 404) throw err;
    }
    onState("reconnecting");
    await pause(backoff, signal);
    backoff = Math.min(backoff * 2, 8000);
  }
}
