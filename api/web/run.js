// The run page: receipt, counters, heatmap, phase timeline, cost panel, live event log, control buttons and the
// review box. The task rows load once from GET /tasks; from then on everything moves with the SSE stream (read
// from its start, so the timeline and log are whole), and the run view (cost, display_status) is re-read at most
// once a second while events arrive. All drawing happens in one requestAnimationFrame callback, at most once per
// frame, however many events a chunk brought.

import { api, download, followEvents } from "./api.js";
import { Breakdown } from "./breakdown.js";
import { duration, h, json, ms, pct, statusBadge, usd, when } from "./dom.js";
import { Heatmap } from "./heatmap.js";
import { openTask } from "./modal.js";
import { describe, Phases } from "./timeline.js";

const LOG_CAP = 300;
const REFRESH_MS = 1000;
const OUTPUT_POLL_MS = 1000;
const OUTPUT_POLLS = 120;
const FILES = [["report.html", "download-report", "Download report"], ["results.json", "download-results", "results.json"]];
const COST_ROWS = [["driver", "Driver tokens"], ["model", "SUT tokens (Materialize)"], ["sandbox", "Sandboxes"],
  ["narration", "Narration"], ["incurred", "Incurred"], ["billed", "Billed (platform share, with markup)"]];

export function runView(root, runId) {
  const abort = new AbortController();
  const path = `/v1/runs/${encodeURIComponent(runId)}`;
  const s = { run: null, config: null, launch: null, invocation: 0, halted: false, terminal: false,
              stream: "connecting", lastSeq: -1, newLog: [], dirty: new Set(), frame: 0, files: {} };
  const phases = new Phases();

  const el = {
    title: h("h1", {}, "Run ", h("span", { class: "mono" }, runId)),
    status: h("span", { id: "run-status" }),
    temporal: h("a", { id: "temporal-link", target: "_blank", rel: "noopener", hidden: true }, "Temporal UI ↗"),
    stream: h("span", { id: "stream-state", class: "muted" }),
    files: h("span", { id: "report-files", class: "files", hidden: true }),
    pause: h("button", { id: "btn-pause", disabled: true }, "Pause"),
    resume: h("button", { id: "btn-resume", disabled: true }, "Resume"),
    stop: h("button", { id: "btn-stop", class: "danger", disabled: true }, "Stop"),
    flash: h("p", { id: "flash", class: "error", role: "alert" }),
    review: h("section", { id: "review-box", class: "card review", hidden: true }),
    narration: h("p", { id: "narration", class: "narration" }),
    counters: h("div", { id: "counters", class: "counters" }),
    canvas: h("canvas", { id: "heatmap", role: "img", "aria-label": "task outcomes" }),
    legend: h("p", { class: "legend" }, ["pass", "fail", "err", "running", "pending"].map((k) =>
      h("span", { class: `key key-${k}` }, k))),
    receipt: h("dl", { id: "receipt", class: "facts" }),
    cost: h("table", { id: "cost-panel", class: "cost" }),
    timeline: h("div", { id: "timeline" }),
    log: h("ol", { id: "event-log", class: "log", reversed: true }),
  };
  const heatmap = new Heatmap(el.canvas, { onCell: (index) => openTask(runId, index) });
  const breakdown = new Breakdown(runId, { signal: abort.signal });

  root.append(h("section", { class: "run" },
    h("div", { class: "run-head" }, el.title, el.status, el.temporal, el.files, el.stream,
      h("div", { class: "controls" }, el.pause, el.resume, el.stop)),
    el.flash, el.review,
    h("section", { id: "narration-card", class: "card", hidden: true }, h("h2", {}, "Summary"), el.narration),
    el.counters,
    h("div", { class: "columns" },
      h("section", { class: "card wide" }, h("h2", {}, "Tasks"), h("div", { class: "heatmap-box" }, el.canvas),
        el.legend),
      h("div", { class: "side" },
        h("section", { class: "card" }, h("h2", {}, "Receipt"), el.receipt),
        h("section", { class: "card" }, h("h2", {}, "Cost"), el.cost))),
    breakdown.card,
    h("section", { class: "card" }, h("h2", {}, "Phases"), el.timeline),
    h("section", { class: "card" }, h("h2", {}, "Events ", h("span", { class: "muted" }, `(latest ${LOG_CAP})`)),
      el.log)));

  function mark(...parts) {
    for (const p of parts) s.dirty.add(p);
    if (!s.frame) s.frame = requestAnimationFrame(render);
  }

  // --- data in -------------------------------------------------------------------------------------------------
  function setRun(run) {
    s.run = run;
    s.halted = run.halted;
    s.terminal = s.terminal || run.terminal;
    if (run.tasks.summary.total > heatmap.cells.length) heatmap.setTotal(run.tasks.summary.total);
    mark("head", "receipt", "cost", "counters", "heatmap");
    breakdown.refresh(s.terminal);
  }

  function onEvents(events) {
    for (const ev of events) {
      const d = ev.data;
      if (phases.apply(ev)) s.dirty.add("timeline");
      switch (ev.type) {
        case "RunLaunched": s.launch = d.launch; s.dirty.add("receipt"); break;
        case "DatasetTasksArtifact": if (d.count > heatmap.cells.length) heatmap.setTotal(d.count); break;
        case "MaterializeTaskAggregated":
          if (d.invocation > s.invocation) { s.invocation = d.invocation; heatmap.reset(); }
          if (d.invocation === s.invocation) heatmap.set(d.index, d.outcome);
          s.dirty.add("heatmap").add("counters");
          break;
        case "RunHalted": s.halted = true; s.dirty.add("head"); break;
        case "RunResumed": s.halted = false; s.dirty.add("head"); break;
        case "PipelineFinished": s.terminal = true; s.dirty.add("head"); break;
        default: break;
      }
      s.lastSeq = ev.seq;
      s.newLog.push(ev);
    }
    if (s.newLog.length > LOG_CAP) s.newLog = s.newLog.slice(-LOG_CAP);
    mark("log", "heatmap", "counters");
    refreshSoon();
  }

  let refreshTimer = null;
  let lastRefresh = 0;
  function refreshSoon() {
    if (refreshTimer) return;
    const wait = Math.max(0, lastRefresh + REFRESH_MS - Date.now());
    refreshTimer = setTimeout(async () => {
      lastRefresh = Date.now();
      try { setRun(await api(path, { signal: abort.signal })); } catch { /* the next event retries */ }
      refreshTimer = null;
    }, wait);
  }

  async function loadTasks() {
    let after = -1;
    for (;;) {
      const page = await api(`${path}/tasks?after=${after}&limit=5000`, { signal: abort.signal });
      for (const t of page.tasks) {
        if (t.invocation > s.invocation) { s.invocation = t.invocation; heatmap.reset(); }
        if (t.invocation === s.invocation && t.outcome !== "running") heatmap.set(t.index, t.outcome);
      }
      mark("heatmap", "counters");
      if (!page.tasks.length || page.next_after === null || page.next_after === after) return;
      after = page.next_after;
    }
  }

  async function start() {
    try {
      const [run, config] = await Promise.all([api(path, { signal: abort.signal }),
                                               api("/v1/ui/config", { signal: abort.signal })]);
      s.config = config;
      setRun(run);
      await loadTasks();
      await followEvents(runId, { signal: abort.signal, onEvents,
        onState: (state) => { s.stream = state; mark("head"); } });
      if (!abort.signal.aborted) setRun(await api(path, { signal: abort.signal }));
      await followOutputs();
    } catch (err) {
      if (!abort.signal.aborted) el.flash.textContent = `Could not load the run: ${err.message}`;
    }
  }

  // The report's files (ReportFile events) are written after the terminal event, where the stream closes: read
  // what follows it by polling until the report is there, and offer its files for download.
  async function followOutputs() {
    let after = s.lastSeq;
    for (let i = 0; i < OUTPUT_POLLS && !abort.signal.aborted && !s.files["report.html"]; i += 1) {
      const page = await api(`${path}/events?after=${after}`, { signal: abort.signal });
      for (const ev of page.events) if (ev.type === "ReportFile") s.files[ev.data.name] = ev.data;
      after = page.next_after;
      mark("files");
      if (!page.events.length) await new Promise((resolve) => setTimeout(resolve, OUTPUT_POLL_MS));
    }
  }

  // --- controls --------------------------------------------------------------------------------------------------
  async function control(action, body, method = "POST") {
    el.flash.textContent = "";
    for (const b of [el.pause, el.resume, el.stop]) b.disabled = true;
    try {
      setRun(await api(action ? `${path}/${action}` : path, { method, body }));
    } catch (err) {
      el.flash.textContent = `${action || "review"}: ${err.message}`;
      mark("head");
    }
  }
  el.pause.addEventListener("click", () => control("pause"));
  el.resume.addEventListener("click", () => control("resume"));
  el.stop.addEventListener("click", () => {
    if (confirm("Stop this run for good? Finished tasks are kept.")) control("stop", { reason: "stopped from the dashboard" });
  });

  // --- drawing ---------------------------------------------------------------------------------------------------
  function render() {
    s.frame = 0;
    const dirty = s.dirty;
    s.dirty = new Set();
    const run = s.run;
    if (!run) return;
    heatmap.running = phases.materializeOpen && !s.halted && !s.terminal;
    if (dirty.has("heatmap")) heatmap.draw();
    if (dirty.has("counters")) renderCounters();
    if (dirty.has("head")) renderHead(run);
    if (dirty.has("head")) renderNarration(run);
    if (dirty.has("receipt")) renderReceipt(run);
    if (dirty.has("cost")) renderCost(run.cost);
    if (dirty.has("timeline")) phases.render(el.timeline, Date.now());
    if (dirty.has("log")) renderLog();
    if (dirty.has("files")) renderFiles();
  }

  function renderFiles() {
    const links = FILES.filter(([name]) => s.files[name]).map(([name, id, label]) => {
      const href = `${path}/files/${encodeURIComponent(name)}`;
      const file = s.files[name];
      return h("a", { id, href, download: name, dataset: { digest: file.digest, size: String(file.size) },
                      title: `${name}: ${file.media_type}, ${file.size} bytes, sha256 ${file.digest}`,
                      onclick: (e) => {
                        e.preventDefault();
                        el.flash.textContent = "";
                        download(href, name).catch((err) => { el.flash.textContent = `${name}: ${err.message}`; });
                      } }, label);
    });
    el.files.replaceChildren(...links);
    el.files.hidden = !links.length;
  }

  function renderCounters() {
    const [pending, passed, failed, errored] = heatmap.counts;
    const running = heatmap.running ? pending : 0;
    const rate = passed + failed ? passed / (passed + failed) : null;
    const counter = (id, label, value) => h("div", { class: `counter counter-${id}`, id: `count-${id}`,
                                                      dataset: { value: String(value) } },
      h("span", { class: "value" }, value), h("span", { class: "label" }, label));
    el.counters.replaceChildren(counter("passed", "passed", passed), counter("failed", "failed", failed),
      counter("no_answer", "no answer (of failed)", s.run.tasks.summary.no_answer ?? 0),
      counter("errored", "errored", errored), counter("running", "running", running),
      counter("total", "tasks", heatmap.cells.length),
      h("div", { class: "counter", id: "count-rate", dataset: { value: rate === null ? "" : String(rate) } },
        h("span", { class: "value" }, pct(rate)), h("span", { class: "label" }, "pass rate (errors excluded)")));
  }

  function renderHead(run) {
    el.status.replaceChildren(statusBadge(run.display_status),
      run.halt_reason ? h("span", { class: "muted" }, ` ${run.halt_reason}`) : "");
    el.root ??= root.querySelector(".run");
    el.root.dataset.displayStatus = run.display_status;
    el.stream.textContent = { live: "● live", reconnecting: "reconnecting…", done: "log closed",
                              connecting: "connecting…" }[s.stream] ?? s.stream;
    el.stream.dataset.state = s.stream;
    const cfg = s.config;
    if (cfg?.temporal_ui_url) {
      el.temporal.href = `${cfg.temporal_ui_url}/namespaces/${encodeURIComponent(cfg.temporal_namespace)}/workflows/${encodeURIComponent(run.id)}`;
      el.temporal.hidden = false;
    }
    const over = run.terminal || s.terminal;
    el.pause.disabled = over || run.display_status !== "running";
    el.resume.disabled = over || run.display_status !== "paused";
    el.stop.disabled = over;
    renderReview(run, over);
  }

  // The terminal run's prose summary (issue 26): recorded after its terminal event, shown as the API gives it.
  function renderNarration(run) {
    const text = run.narration ?? "";
    el.narration.textContent = text;
    el.narration.closest("section").hidden = !text;
  }

  function renderReview(run, over) {
    const waiting = !over && run.display_status === "waiting";
    if (!waiting) { el.review.hidden = true; el.review.replaceChildren(); return; }
    if (!el.review.hidden) return; // keep what the person is typing
    const text = h("textarea", { id: "review-text", rows: 4, placeholder: "Your guidance for the Driver…" });
    const send = h("button", { id: "review-send" }, "Resolve review");
    send.addEventListener("click", () => {
      if (text.value.trim()) control("", { review_resolution: text.value.trim() }, "PATCH");
    });
    el.review.replaceChildren(h("h2", {}, "Waiting for a review"),
      h("p", {}, run.halt_reason ?? ""), text, send);
    el.review.hidden = false;
  }

  function renderReceipt(run) {
    const launch = s.launch ?? {};
    const trials = run.trials_config ?? {};
    const rows = [
      ["Run", run.id], ["Model", run.model.identifier + (run.model.api_base ? ` @ ${run.model.api_base}` : "")],
      ["Driver", run.driver], ["Dataset", launch.dataset ?? "…"],
      ["Compute", [run.backend, run.materialize_mode, run.isolation && `isolation: ${run.isolation}`]
        .filter(Boolean).join(", ") || "–"],
      ["Fingerprint", run.fingerprint ?? "– (the registry records it)"],
      ["Trials", trials.plan ? `k=${trials.plan.k}, ${trials.aggregator?.name ?? ""}` : "–"],
      ["Limits", run.limits && Object.keys(run.limits).length ? json(run.limits) : "defaults"],
      ["Concurrency", launch.concurrency ?? "deployment default"],
      ["Started", when(run.created_at)],
      ["Duration", duration((run.finished_at ? ms(run.finished_at) : Date.now()) - ms(run.created_at))],
      ["Phase", run.phase ?? "–"],
    ];
    if (run.error) rows.push(["Error", run.error]);
    el.receipt.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k),
      h("dd", { class: k === "Limits" ? "mono pre" : "", dataset: { field: k.toLowerCase() } }, String(v))]));
  }

  function renderCost(cost) {
    const rows = COST_ROWS.map(([key, label]) => h("tr", { dataset: { cost: key }, class: key === "incurred" ? "sum" : "" },
      h("td", {}, label), h("td", { class: "num" }, usd(cost[key]))));
    rows.push(h("tr", { dataset: { cost: "proxy_linger" } }, h("td", {}, "Proxy linger (after the run, not incurred)"),
      h("td", { class: "num" }, usd(cost.proxy_linger.amount_usd))));
    el.cost.replaceChildren(h("tbody", {}, rows));
  }

  function renderLog() {
    const fresh = s.newLog;
    s.newLog = [];
    const frag = document.createDocumentFragment();
    for (let i = fresh.length - 1; i >= 0; i -= 1) {
      const ev = fresh[i];
      frag.append(h("li", { class: `ev ev-${ev.type}`, value: String(ev.seq), title: json(ev.data) },
        h("span", { class: "seq" }, ev.seq), h("span", { class: "time" }, new Date(ms(ev.created_at)).toLocaleTimeString()),
        h("span", { class: "type" }, ev.type), h("span", { class: "text" }, describe(ev))));
    }
    el.log.prepend(frag);
    while (el.log.childElementCount > LOG_CAP) el.log.lastElementChild.remove();
    el.log.dataset.lastSeq = String(s.lastSeq);
  }

  // Open phases and durations move with the clock, not only with events.
  const tick = setInterval(() => { if (s.run && !s.terminal) mark("timeline", "receipt"); }, 1000);
  const onResize = () => mark("heatmap");
  window.addEventListener("resize", onResize);
  start();
  return () => {
    abort.abort();
    clearInterval(tick);
    clearTimeout(refreshTimer);
    breakdown.stop();
    if (s.frame) cancelAnimationFrame(s.frame);
    window.removeEventListener("resize", onResize);
    document.getElementById("task-modal")?.remove();
  };
}
