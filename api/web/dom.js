// Small DOM and formatting helpers. Every string from the API goes in as text (textContent), never as HTML.

/** h("td", {class: "x", dataset: {k: "v"}, onclick: fn}, "text", childNode, [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

export const usd = (v) => (v === null || v === undefined ? "–" : `$${Number(v).toFixed(Math.abs(v) < 0.01 && v !== 0 ? 6 : 4)}`);
export const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`);

export function when(iso) {
  if (!iso) return "–";
  return new Date(iso).toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

/** API datetimes are UTC; older rows may come without the zone suffix. */
export function ms(iso) {
  return Date.parse(/[zZ]|[+-]\d\d:\d\d$/.test(iso) ? iso : `${iso}Z`);
}

export function duration(milliseconds) {
  if (milliseconds === null || milliseconds === undefined || Number.isNaN(milliseconds)) return "–";
  const s = milliseconds / 1000;
  if (s < 1) return `${Math.round(milliseconds)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} m`;
}

export function runDuration(run) {
  const end = run.finished_at ? ms(run.finished_at) : Date.now();
  return duration(end - ms(run.created_at));
}

export function statusBadge(displayStatus) {
  return h("span", { class: `badge status-${displayStatus}`, dataset: { status: displayStatus } }, displayStatus);
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}
