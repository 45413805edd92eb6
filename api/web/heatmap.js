// One cell per task index on a <canvas>: a 10,000-task run is one bitmap redrawn at most once per animation frame,
// never 10,000 DOM nodes. The geometry is published on the canvas's data attributes (cells, cols, pitch, cell) so
// a test, or a person in devtools, can find any task's cell.

export const PENDING = 0;
export const PASS = 1;
export const FAIL = 2;
export const ERR = 3;
export const CODE = { pass: PASS, fail: FAIL, err: ERR };
const COLOURS = { pass: "#2e9e44", fail: "#e0b400", err: "#d64541", running: "#14a3a8", pending: "#dde2e8" };
const SIZES = [28, 20, 14, 10, 8, 6, 5, 4, 3, 2];
const MAX_HEIGHT = 420;

export class Heatmap {
  constructor(canvas, { onCell }) {
    this.canvas = canvas;
    this.cells = new Uint8Array(0);
    this.running = false;
    this.counts = [0, 0, 0, 0];
    this.canvas.addEventListener("click", (e) => {
      const index = this.indexAt(e.offsetX, e.offsetY);
      if (index !== null) onCell(index);
    });
    this.canvas.addEventListener("mousemove", (e) => {
      const index = this.indexAt(e.offsetX, e.offsetY);
      this.canvas.title = index === null ? "" : `task ${index}: ${this.outcome(index)}`;
      this.canvas.style.cursor = index === null ? "default" : "pointer";
    });
  }

  /** Grow (or shrink) to `total` cells, keeping the outcomes already known. */
  setTotal(total) {
    if (total === this.cells.length) return;
    const cells = new Uint8Array(total);
    cells.set(this.cells.subarray(0, Math.min(total, this.cells.length)));
    this.cells = cells;
    this.counts = [0, 0, 0, 0];
    for (const c of cells) this.counts[c] += 1;
  }

  reset() {
    this.cells.fill(PENDING);
    this.counts = [this.cells.length, 0, 0, 0];
  }

  set(index, outcome) {
    if (index >= this.cells.length) this.setTotal(index + 1);
    const code = CODE[outcome] ?? PENDING;
    this.counts[this.cells[index]] -= 1;
    this.counts[code] += 1;
    this.cells[index] = code;
  }

  outcome(index) {
    const code = this.cells[index];
    if (code === PENDING) return this.running ? "running" : "pending";
    return ["", "pass", "fail", "err"][code];
  }

  layout() {
    const total = Math.max(this.cells.length, 1);
    const width = Math.max(this.canvas.parentElement.clientWidth, 120);
    let pitch = SIZES[SIZES.length - 1];
    for (const size of SIZES) {
      if (Math.ceil(total / Math.floor(width / size)) * size <= MAX_HEIGHT) { pitch = size; break; }
    }
    const cols = Math.max(1, Math.floor(width / pitch));
    const rows = Math.ceil(total / cols);
    this.geometry = { pitch, cell: pitch >= 5 ? pitch - 1 : pitch, cols, rows };
    const dpr = window.devicePixelRatio || 1;
    const cssW = cols * pitch;
    const cssH = Math.max(rows * pitch, pitch);
    this.canvas.style.width = `${cssW}px`;
    this.canvas.style.height = `${cssH}px`;
    this.canvas.width = Math.round(cssW * dpr);
    this.canvas.height = Math.round(cssH * dpr);
    Object.assign(this.canvas.dataset, { cells: String(this.cells.length), cols: String(cols),
                                         pitch: String(pitch), cell: String(this.geometry.cell) });
    this.laidOutFor = `${this.cells.length}:${width}`;
  }

  indexAt(x, y) {
    if (!this.geometry) return null;
    const { pitch, cols } = this.geometry;
    const col = Math.floor(x / pitch);
    const index = Math.floor(y / pitch) * cols + col;
    return col < cols && index >= 0 && index < this.cells.length ? index : null;
  }

  draw() {
    const width = Math.max(this.canvas.parentElement.clientWidth, 120);
    if (this.laidOutFor !== `${this.cells.length}:${width}`) this.layout();
    const started = performance.now();
    const ctx = this.canvas.getContext("2d");
    const dpr = window.devicePixelRatio || 1;
    const { pitch, cell, cols } = this.geometry;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    const colours = [this.running ? COLOURS.running : COLOURS.pending, COLOURS.pass, COLOURS.fail, COLOURS.err];
    // One pass per colour, 4 fillStyle changes rather than one per cell: a full redraw of 10,000 cells took
    // 1.2-4.0 ms in headless Chromium on the 2-core dev machine (tests/web prints it as data-draw-ms).
    for (let code = 0; code < 4; code += 1) {
      if (this.counts[code] === 0) continue;
      ctx.fillStyle = colours[code];
      for (let i = 0; i < this.cells.length; i += 1) {
        if (this.cells[i] === code) ctx.fillRect((i % cols) * pitch, Math.floor(i / cols) * pitch, cell, cell);
      }
    }
    const [pending, passed, failed, errored] = this.counts;
    Object.assign(this.canvas.dataset, { passed: String(passed), failed: String(failed),
                                         errored: String(errored), pending: String(pending),
                                         running: String(this.running ? pending : 0),
                                         drawMs: (performance.now() - started).toFixed(2) });
  }
}

export { COLOURS };
