// The registry's pages (§7): #/benchmarks, one card per benchmark you can see (yours and public ones) with its
// identicon and subsets (all from the one list read); and #/subsets/<id>, a subset's facts and its leaderboard of
// public runs.
// The identicon route needs no key (an id-derived SVG), so it is a plain same-origin <img>.

import { api, ApiError } from "./api.js";
import { h, pct, usd, when } from "./dom.js";

const subsetHref = (id) => `#/subsets/${encodeURIComponent(id)}`;
const runHref = (id) => `#/runs/${encodeURIComponent(id)}`;
/** An impl id is `<benchmark_id>:<12 hex of its task_impl.py>`; within one benchmark the hex names it. */
const implShort = (id) => id.split(":").pop();

function identicon(bench, size) {
  return h("img", { class: "identicon", src: bench.identicon, width: size, height: size,
                    alt: `identicon of ${bench.name}` });
}

function subsetList(bench) {
  return bench.subsets.length
    ? h("ul", { class: "subsets" }, bench.subsets.map((s) => h("li", {},
        h("a", { href: subsetHref(s.id), class: "subset-link", dataset: { subsetId: s.id } }, s.name),
        " ", h("span", { class: "muted" }, `v${s.snapshots.at(-1)?.version ?? 0}, ${s.impls.length} impl(s)`
          + (s.rolling ? ", rolling" : "")))))
    : h("p", { class: "muted" }, "No subsets yet.");
}

function card(bench) {
  return h("article", { class: "card bench-card", dataset: { benchmarkId: bench.id } },
    h("div", { class: "bench-head" }, identicon(bench, 48),
      h("div", {}, h("h3", { class: "bench-name" }, bench.name),
        h("span", { class: `pill vis-${bench.visibility}` }, bench.visibility),
        bench.owned ? h("span", { class: "muted" }, " yours") : null)),
    subsetList(bench));
}

export function benchmarksView(root) {
  const grid = h("div", { class: "bench-grid", id: "bench-grid" });
  const note = h("p", { class: "muted", id: "bench-note" });
  root.append(h("section", { class: "benchmarks" },
    h("div", { class: "toolbar" }, h("h1", {}, "Benchmarks")), note, grid));
  api("/v1/registry/benchmarks").then((list) => {
    // The list carries each benchmark's subsets: one request for the whole page.
    grid.replaceChildren(...list.benchmarks.map(card));
    note.textContent = list.benchmarks.length ? ""
      : "No benchmarks yet: publish a finished run with POST /v1/registry/publish.";
  }).catch((err) => { note.textContent = `Could not load benchmarks: ${err.message}`; });
  return null;
}

function leaderboardTable(board) {
  const ks = [...new Set(board.rows.flatMap((r) => Object.keys(r.pass_at_k)))]
    .sort((a, b) => Number(a) - Number(b));
  return h("table", { class: "grid", id: "leaderboard" },
    h("thead", {}, h("tr", {}, ["#", "Model", "Best score", "Pass rate", ...ks.map((k) => `pass@${k}`), "Runs",
      "Impl", "Cost", "Best run"].map((c) => h("th", {}, c)))),
    h("tbody", {}, board.rows.map((r, i) => h("tr", { class: "board-row",
                                                       dataset: { model: r.model, runId: r.best_run_id } },
      h("td", { class: "num" }, i + 1),
      h("td", { class: "mono" }, r.model),
      h("td", { class: "num" }, r.score === null ? "–" : r.score.toFixed(3)),
      h("td", { class: "num" }, pct(r.pass_rate)),
      ks.map((k) => h("td", { class: "num" }, pct(r.pass_at_k[k]))),
      h("td", { class: "num" }, r.runs),
      h("td", { class: "mono", title: r.impl_id ?? "" }, r.impl_id ? implShort(r.impl_id) : "–"),
      h("td", { class: "num" }, usd(r.cost_usd)),
      h("td", {}, h("a", { href: runHref(r.best_run_id), class: "mono" }, r.best_run_id.slice(0, 8)))))));
}

export function subsetView(root, subsetId) {
  const head = h("div", { class: "run-head" }, h("h1", {}, "Subset"));
  const facts = h("section", { class: "card" }, h("h2", {}, "Subset"));
  const board = h("section", { class: "card", id: "leaderboard-card" }, h("h2", {}, "Leaderboard"),
    h("p", { class: "muted", id: "board-note" }, "Loading…"));
  root.append(head, facts, board);

  (async () => {
    const subset = await api(`/v1/registry/subsets/${encodeURIComponent(subsetId)}`);
    const bench = await api(`/v1/registry/benchmarks/${encodeURIComponent(subset.benchmark_id)}`);
    const latest = subset.snapshots.at(-1);
    head.replaceChildren(identicon(bench, 40),
      h("h1", {}, h("a", { href: "#/benchmarks" }, bench.name), " / ", h("span", { id: "subset-name" }, subset.name)));
    facts.append(h("dl", { class: "facts" },
      h("dt", {}, "Subset id"), h("dd", { class: "mono" }, subset.id),
      h("dt", {}, "Benchmark"), h("dd", {}, `${bench.name} (${bench.visibility})`),
      h("dt", {}, "Rolling"), h("dd", {}, subset.rolling ? "yes (append-only)" : "no"),
      h("dt", {}, "Default trials"),
      h("dd", { class: "mono" }, subset.default_trials ? JSON.stringify(subset.default_trials) : "–"),
      h("dt", {}, "Latest snapshot"), h("dd", {}, latest
        ? [`v${latest.version}, ${latest.count} tasks, `, h("span", { class: "mono", title: latest.tasks_sha256 },
            latest.tasks_sha256.slice(0, 12)), `, ${when(latest.created_at)}`] : "–"),
      h("dt", {}, "Impls"), h("dd", {}, subset.impls.length ? subset.impls.map((i) => h("div", { class: "mono", title: i.id },
        implShort(i.id), i.official ? " (official)" : "")) : "–")));
    try {
      const rows = await api(`/v1/registry/subsets/${encodeURIComponent(subsetId)}/leaderboard`);
      board.replaceChildren(h("h2", {}, "Leaderboard"), rows.rows.length ? leaderboardTable(rows)
        : h("p", { class: "muted", id: "board-note" }, "No public runs on this subset yet."));
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      board.replaceChildren(h("h2", {}, "Leaderboard"),
        h("p", { class: "muted", id: "board-note" }, "A private benchmark has no leaderboard."));
    }
  })().catch((err) => { facts.append(h("p", { class: "error" }, `Could not load the subset: ${err.message}`)); });
  return null;
}
