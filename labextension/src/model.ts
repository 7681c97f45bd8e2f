/**
 * Pure data logic of the GPU views: parse the server extension's JSON defensively and derive
 * the values the status bar item and the side panel display. No DOM, no JupyterLab imports,
 * so it is unit-tested with node's own test runner (test/model.test.ts).
 *
 * REST contract (gpuspawner.gpuviews, under the server's base URL):
 *   GET api/gpuspawner/gpus     -> GpusResponse
 *   GET api/gpuspawner/metrics  -> MetricsResponse
 */

/**
 * The gettext domain of the extension's strings: the plugin loads its bundle with
 * `translator.load(TRANSLATION_DOMAIN)` (JupyterLab's "Internationalization and Localization"
 * guide; domains use `_`, not `-`), and the settings schema names it too.
 */
export const TRANSLATION_DOMAIN = 'gpuspawner';

/**
 * What this module needs of a translation bundle (@jupyterlab/translation's
 * TranslationBundle has these two): `__(msgid, ...args)` and `_n(singular, plural, n, ...args)`,
 * `%1`, `%2`... in the message standing for the arguments (for `_n`, `%1` is `n`).
 */
export interface Trans {
  __(msgid: string, ...args: unknown[]): string;
  _n(msgid: string, msgidPlural: string, n: number, ...args: unknown[]): string;
}

function fill(msg: string, args: unknown[]): string {
  return msg.replace(/%(\d+)/g, (m, i: string) =>
    Number(i) >= 1 && Number(i) <= args.length ? String(args[Number(i) - 1]) : m
  );
}

/**
 * The strings as written, arguments filled in: what JupyterLab's nullTranslator gives, used
 * where no translator is passed (the plugin without ITranslator, the node unit tests: the
 * ESM-only @jupyterlab/translation does not load under their commonjs build).
 */
export const untranslated: Trans = {
  __: (msgid, ...args) => fill(msgid, args),
  _n: (msgid, msgidPlural, n, ...args) => fill(n === 1 ? msgid : msgidPlural, [n, ...args])
};

/** States reported by the server, plus two of the client's own. */
export type ServerState = 'ok' | 'no_nvml' | 'no_gpu' | 'permission' | 'error';
export type ViewState = ServerState | 'loading' | 'unreachable';

export interface GpuInfo {
  uuid: string;
  index: number | null;
  name: string;
  memory_total_bytes: number | null;
  pci_bus_id: string | null;
  numa_node: number | null;
  mig: boolean;
  in_allocation: boolean;
}

export interface CullerStatus {
  status: string;
  cull_at: string | null;
  reason: string | null;
}

/** The hub restarted this server on another node because its node failed (`moved`). */
export interface MoveRecord {
  from: string;
  to: string;
  /** epoch seconds */
  at: number;
  reason: string;
}

export interface GpusResponse {
  state: ServerState;
  message: string;
  allocation: Record<string, unknown> | null;
  gpus: GpuInfo[];
  warnings: string[];
  culler: CullerStatus | null;
  /** absent from servers older than this field: read as null */
  moved?: MoveRecord | null;
  /** what this session's GPU share gives and what holds it; null: a whole GPU or none */
  share?: ShareInfo | null;
  /** the user's own GPU-hours and core-hours this month and budgets; null: not known */
  usage?: OwnUsage | null;
}

/** One usage budget as `api/usage/budgets` gives it (gpuspawner.usage.budgets). */
export interface BudgetInfo {
  name: string;
  unit: string;
  used: number;
  limit: number;
  percent: number;
  renews_at: string;
  warning: boolean;
  exceeded: boolean;
}

/** `usage` of the gpus answer (gpuspawner.singleuser.gpuviews.handlers.OwnUsage). */
export interface OwnUsage {
  from: string;
  gpu_hours: number;
  core_hours: number;
  budgets: BudgetInfo[];
}

/** `share` of the gpus answer (gpuspawner.singleuser.gpuviews.handlers.share_from_env). */
export interface ShareInfo {
  milli: number;
  memory_limit_bytes: number;
  mechanism: string;
  /** "1/4 of an A100: 20 GiB of GPU memory, compute time shared; held by ..." */
  text: string;
}

export interface ProcessInfo {
  pid: number;
  used_memory_bytes: number | null;
  kernel_id: string | null;
}

export interface GpuSample {
  uuid: string;
  utilization_percent: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  temperature_c: number | null;
  power_w: number | null;
  processes: ProcessInfo[];
}

export interface HistoryPoint {
  timestamp: number | null; // milliseconds since the epoch
  gpus: Record<string, { utilization_percent: number | null; memory_used_bytes: number | null }>;
}

export interface MetricsResponse {
  state: ServerState;
  message: string;
  timestamp: number | null; // milliseconds since the epoch
  gpus: GpuSample[];
  history: HistoryPoint[];
}

const SERVER_STATES: ServerState[] = ['ok', 'no_nvml', 'no_gpu', 'permission', 'error'];

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A finite number, or null (NaN, strings, missing values all become null). */
export function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function arr(v: unknown): unknown[] {
  return Array.isArray(v) ? v : [];
}

function state(v: unknown): ServerState {
  return SERVER_STATES.includes(v as ServerState) ? (v as ServerState) : 'error';
}

/**
 * A timestamp as milliseconds since the epoch: ISO strings, or numbers in seconds (Python's
 * time.time()) or milliseconds (anything above 1e11 is taken as milliseconds).
 */
export function parseTime(v: unknown): number | null {
  if (typeof v === 'number' && Number.isFinite(v)) {
    return v > 1e11 ? v : v * 1000;
  }
  if (typeof v === 'string' && v) {
    const t = Date.parse(v);
    return Number.isNaN(t) ? null : t;
  }
  return null;
}

export class ParseError extends Error {}

// ------------------------------------------------------------------------------------------
// User settings (schema/plugin.json, edited in JupyterLab's Settings Editor)

/** How memory is shown: automatic binary units, fixed MiB or GiB, or percent of the total. */
export type MemoryUnits = 'auto' | 'MiB' | 'GiB' | 'percent';

export const MEMORY_UNITS: MemoryUnits[] = ['auto', 'MiB', 'GiB', 'percent'];

/** The smallest poll interval the settings accept (schema/plugin.json's minimum). */
export const MIN_POLL_INTERVAL_MS = 500;
/** The largest one: an hour (a larger number is taken as this). */
export const MAX_POLL_INTERVAL_MS = 3600 * 1000;

export interface ViewSettings {
  /** ms between two requests while the side panel is visible */
  pollInterval: number;
  /** ms between two requests while only the status bar item is shown */
  statusPollInterval: number;
  /** which GPUs to show: indices ("0") or UUIDs; empty = the session's GPUs */
  gpus: string[];
  /** memory units */
  units: MemoryUnits;
  /** show the status bar item in a session without a GPU ("GPU: no GPU"); false hides it */
  showWithoutGpu: boolean;
  /** show the idle culler's warnings as JupyterLab notifications */
  cullNotifications: boolean;
}

export const DEFAULT_SETTINGS: ViewSettings = {
  pollInterval: 2000,
  statusPollInterval: 5000,
  gpus: [],
  units: 'auto',
  showWithoutGpu: true,
  cullNotifications: true
};

function interval(v: unknown, fallback: number): number {
  const n = num(v);
  if (n === null) {
    return fallback;
  }
  return Math.round(Math.min(Math.max(n, MIN_POLL_INTERVAL_MS), MAX_POLL_INTERVAL_MS));
}

/**
 * The settings as the views use them, from the setting registry's composite (user settings
 * over the schema's defaults). Defensive: a missing or invalid value gives the default,
 * intervals are clamped to [MIN_POLL_INTERVAL_MS, MAX_POLL_INTERVAL_MS], GPU entries are
 * trimmed strings (numbers are taken as indices), duplicates and empty entries dropped.
 */
export function parseSettings(raw: unknown): ViewSettings {
  const o = isObj(raw) ? raw : {};
  const gpus: string[] = [];
  for (const g of arr(o.gpus)) {
    const v = typeof g === 'number' && Number.isInteger(g) && g >= 0 ? String(g) : str(g)?.trim();
    if (v && !gpus.includes(v)) {
      gpus.push(v);
    }
  }
  return {
    pollInterval: interval(o.pollInterval, DEFAULT_SETTINGS.pollInterval),
    statusPollInterval: interval(o.statusPollInterval, DEFAULT_SETTINGS.statusPollInterval),
    gpus,
    units: MEMORY_UNITS.includes(o.units as MemoryUnits)
      ? (o.units as MemoryUnits)
      : DEFAULT_SETTINGS.units,
    showWithoutGpu:
      typeof o.showWithoutGpu === 'boolean' ? o.showWithoutGpu : DEFAULT_SETTINGS.showWithoutGpu,
    cullNotifications:
      typeof o.cullNotifications === 'boolean'
        ? o.cullNotifications
        : DEFAULT_SETTINGS.cullNotifications
  };
}

/**
 * The poll interval for the viewers that are visible: the panel's while the panel is
 * visible, else the status bar's.
 */
export function pollIntervalFor(panelVisible: boolean, settings: ViewSettings): number {
  return panelVisible ? settings.pollInterval : settings.statusPollInterval;
}

/** True when a GPU matches a settings entry: its index ("0") or its UUID (case-insensitive). */
export function gpuMatches(info: GpuInfo, entry: string): boolean {
  if (/^\d+$/.test(entry)) {
    return info.index === Number(entry);
  }
  return info.uuid.toLowerCase() === entry.toLowerCase();
}

/**
 * The GPUs to show: with no selection, the session's GPUs (sessionGpus); with one, every GPU
 * the server reports that matches an entry (by index or UUID).
 */
export function selectGpus(gpus: GpuInfo[], selection: string[] = []): GpuInfo[] {
  if (selection.length === 0) {
    return sessionGpus(gpus);
  }
  return gpus.filter(g => selection.some(e => gpuMatches(g, e)));
}

export function parseGpus(raw: unknown): GpusResponse {
  if (!isObj(raw)) {
    throw new ParseError('the gpus answer is not a JSON object');
  }
  const gpus: GpuInfo[] = arr(raw.gpus)
    .filter(isObj)
    .map((g, i) => ({
      uuid: str(g.uuid) ?? `gpu-${i}`,
      index: num(g.index),
      name: str(g.name) ?? 'GPU',
      memory_total_bytes: num(g.memory_total_bytes),
      pci_bus_id: str(g.pci_bus_id),
      numa_node: num(g.numa_node),
      mig: g.mig === true,
      in_allocation: g.in_allocation === true
    }));
  return {
    state: state(raw.state),
    message: str(raw.message) ?? '',
    allocation: isObj(raw.allocation) ? raw.allocation : null,
    gpus,
    warnings: arr(raw.warnings).filter((w): w is string => typeof w === 'string'),
    culler: parseCuller(raw.culler),
    moved: parseMove(raw.moved),
    share: parseShare(raw.share),
    usage: parseOwnUsage(raw.usage)
  };
}

/** `usage` of the gpus answer; null when absent or malformed (bad budgets are left out). */
export function parseOwnUsage(raw: unknown): OwnUsage | null {
  if (!isObj(raw)) {
    return null;
  }
  const gpu = num(raw.gpu_hours);
  const core = num(raw.core_hours);
  if (gpu === null || core === null) {
    return null;
  }
  const budgets: BudgetInfo[] = [];
  for (const b of arr(raw.budgets)) {
    if (!isObj(b)) {
      continue;
    }
    const used = num(b.used);
    const limit = num(b.limit);
    const percent = num(b.percent);
    const name = str(b.name);
    if (used === null || limit === null || percent === null || !name) {
      continue;
    }
    budgets.push({
      name,
      unit: str(b.unit) ?? '',
      used,
      limit,
      percent,
      renews_at: str(b.renews_at) ?? '',
      warning: b.warning === true,
      exceeded: b.exceeded === true
    });
  }
  return { from: str(raw.from) ?? '', gpu_hours: gpu, core_hours: core, budgets };
}

/** One line per budget: "Budget default: 12.5 of 15 GPU-hours (83 %), renews 2026-12-01". */
export function budgetLine(b: BudgetInfo, trans: Trans = untranslated): string {
  const unit = b.unit === 'core_hours' ? trans.__('core-hours') : trans.__('GPU-hours');
  const renews = b.renews_at.slice(0, 10);
  if (b.exceeded) {
    return trans.__(
      'Budget %1 is used up: %2 of %3 %4; new spawns are refused until %5',
      b.name,
      fmtHours(b.used),
      fmtHours(b.limit),
      unit,
      renews
    );
  }
  return trans.__(
    'Budget %1: %2 of %3 %4 (%5 %), renews %6',
    b.name,
    fmtHours(b.used),
    fmtHours(b.limit),
    unit,
    String(Math.round(b.percent)),
    renews
  );
}

function fmtHours(h: number): string {
  return h >= 100 ? h.toFixed(0) : h.toFixed(1);
}

/** `share` of the gpus answer; null when absent or malformed. */
export function parseShare(raw: unknown): ShareInfo | null {
  if (!isObj(raw)) {
    return null;
  }
  const milli = num(raw.milli);
  const limit = num(raw.memory_limit_bytes);
  const text = str(raw.text);
  if (milli === null || limit === null || !text) {
    return null;
  }
  return { milli, memory_limit_bytes: limit, mechanism: str(raw.mechanism) ?? '', text };
}

/** `moved` of the gpus answer; null when absent or malformed. */
export function parseMove(raw: unknown): MoveRecord | null {
  if (!isObj(raw)) {
    return null;
  }
  const from = str(raw.from);
  const to = str(raw.to);
  const at = num(raw.at);
  if (!from || !to || at === null) {
    return null;
  }
  return { from, to, at, reason: str(raw.reason) ?? '' };
}

/** JupyterLab truncates a notification's message past this many characters (apputils). */
export const NOTIFICATION_MAX = 140;

/**
 * The user's words for a move (what the hub's spawn page says,
 * gpuspawner.hub.spawner.GPUSpawner.restart_elsewhere), time in UTC, within JupyterLab's
 * 140 characters: the reason is added only where it fits. `key` names the move, so it is
 * told once.
 */
export function moveNotice(
  moved: MoveRecord | null | undefined,
  trans: Trans = untranslated
): { key: string; message: string } | null {
  if (!moved) {
    return null;
  }
  const when = new Date(moved.at * 1000).toISOString().slice(0, 16).replace('T', ' ');
  const base = trans.__(
    'Your server moved from node %1 to node %2 at %3 UTC. Files in your home are safe; running kernels were lost.',
    moved.from,
    moved.to,
    when
  );
  const withWhy = moved.reason ? trans.__('%1 Why: %2.', base, moved.reason) : base;
  return {
    key: `${moved.from}|${moved.to}|${moved.at}`,
    message: withWhy.length <= NOTIFICATION_MAX ? withWhy : base
  };
}

/** Decision actions of the idle culler service (idle_culler.core.Decision) as statuses. */
const CULLER_ACTIONS: Record<string, string> = {
  warn: 'warned',
  cull: 'culling',
  keep: 'ok',
  skip: 'ok'
};

/**
 * The culler's status for this server. Two shapes are read: the server extension's
 * `{"server": <idle culler decision: action, reason, message, cull_at…>, "last_pass": …}` and a
 * flat `{"status": "warned", "cull_at": ISO, "reason": str}`.
 */
export function parseCuller(raw: unknown): CullerStatus | null {
  if (!isObj(raw)) {
    return null;
  }
  if (isObj(raw.server)) {
    const d = raw.server;
    const action = str(d.action) ?? 'unknown';
    const message = str(d.message) ?? '';
    const because = /because (.+)$/.exec(message);
    return {
      status: CULLER_ACTIONS[action] ?? action,
      cull_at: str(d.cull_at) ?? (typeof d.cull_at === 'number' ? String(d.cull_at) : null),
      reason: because ? because[1] : str(d.reason)
    };
  }
  return {
    status: str(raw.status) ?? 'unknown',
    cull_at: str(raw.cull_at),
    reason: str(raw.reason)
  };
}

export function parseMetrics(raw: unknown): MetricsResponse {
  if (!isObj(raw)) {
    throw new ParseError('the metrics answer is not a JSON object');
  }
  const gpus: GpuSample[] = arr(raw.gpus)
    .filter(isObj)
    .map((g, i) => ({
      uuid: str(g.uuid) ?? `gpu-${i}`,
      utilization_percent: num(g.utilization_percent),
      memory_used_bytes: num(g.memory_used_bytes),
      memory_total_bytes: num(g.memory_total_bytes),
      temperature_c: num(g.temperature_c),
      power_w: num(g.power_w),
      processes: arr(g.processes)
        .filter(isObj)
        .filter(p => num(p.pid) !== null)
        .map(p => ({
          pid: num(p.pid) as number,
          used_memory_bytes: num(p.used_memory_bytes),
          kernel_id: str(p.kernel_id)
        }))
    }));
  const history: HistoryPoint[] = arr(raw.history)
    .filter(isObj)
    .map(h => {
      const per: HistoryPoint['gpus'] = {};
      if (isObj(h.gpus)) {
        for (const [uuid, v] of Object.entries(h.gpus)) {
          if (isObj(v)) {
            per[uuid] = {
              utilization_percent: num(v.utilization_percent),
              memory_used_bytes: num(v.memory_used_bytes)
            };
          }
        }
      }
      return { timestamp: parseTime(h.timestamp), gpus: per };
    });
  return {
    state: state(raw.state),
    message: str(raw.message) ?? '',
    timestamp: parseTime(raw.timestamp),
    gpus,
    history
  };
}

/** Bytes as "512 MiB", "3.2 GiB"; "–" when unknown. */
export function formatBytes(b: number | null): string {
  if (b === null) {
    return '–';
  }
  const KiB = 1024;
  const MiB = KiB * 1024;
  const GiB = MiB * 1024;
  if (b >= GiB) {
    return `${(b / GiB).toFixed(1)} GiB`;
  }
  if (b >= MiB) {
    return `${Math.round(b / MiB)} MiB`;
  }
  if (b >= KiB) {
    return `${Math.round(b / KiB)} KiB`;
  }
  return `${Math.round(b)} B`;
}

export function formatPercent(p: number | null): string {
  return p === null ? 'n/a' : `${Math.round(p)}%`;
}

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

/** Bytes in the given units ('percent' and 'auto' use formatBytes); "–" when unknown. */
export function formatBytesIn(b: number | null, units: MemoryUnits): string {
  if (b === null) {
    return '–';
  }
  if (units === 'MiB') {
    return `${Math.round(b / MiB)} MiB`;
  }
  if (units === 'GiB') {
    return `${(b / GiB).toFixed(1)} GiB`;
  }
  return formatBytes(b);
}

/**
 * Used and total memory in the given units. `compact` (the status bar) shares the unit:
 * "3.2/16.0 GiB", "3277/16384 MiB", "mem 20%"; else "3.2 GiB / 16.0 GiB", "20% of 16.0 GiB".
 * Without a used value, the total alone; percent without a total falls back to 'auto'.
 */
export function formatMemory(
  used: number | null,
  total: number | null,
  units: MemoryUnits,
  compact = false
): string {
  if (used === null) {
    return formatBytesIn(total, units === 'percent' ? 'auto' : units);
  }
  if (units === 'percent') {
    if (total !== null && total > 0) {
      const pct = formatPercent((100 * used) / total);
      return compact ? `mem ${pct}` : `${pct} of ${formatBytes(total)}`;
    }
    units = 'auto';
  }
  const u = formatBytesIn(used, units);
  const t = formatBytesIn(total, units);
  if (!compact) {
    return `${u} / ${t}`;
  }
  const unit = / ([KMG]i)?B$/.exec(t)?.[0];
  return unit && u.endsWith(unit) ? `${u.slice(0, -unit.length)}/${t}` : `${u}/${t}`;
}

/**
 * The session's GPUs: those the server marks as part of the allocation; when none is marked
 * (no allocation known, e.g. a plain JupyterLab), every GPU NVML shows.
 */
export function sessionGpus(gpus: GpuInfo[]): GpuInfo[] {
  const mine = gpus.filter(g => g.in_allocation);
  return mine.length > 0 ? mine : gpus;
}

export type Level = 'ok' | 'warn' | 'error' | 'idle';

export interface StatusView {
  /** short text for the status bar */
  text: string;
  /** tooltip */
  title: string;
  level: Level;
}

/**
 * True when gpuspawner placed this session without any GPU (its allocation lists none): then
 * a missing NVML is expected, not an error, and the views say "no GPU" in neutral colours.
 */
export function sessionWithoutGpu(g: GpusResponse): boolean {
  const alloc = g.allocation as { gpus?: unknown } | null;
  return (
    alloc !== null &&
    Array.isArray(alloc.gpus) &&
    alloc.gpus.length === 0 &&
    (g.state === 'no_nvml' || g.state === 'no_gpu')
  );
}

/** Display text of a non-ok state. */
export function stateText(s: ViewState, trans: Trans = untranslated): string {
  switch (s) {
    case 'loading':
      return trans.__('loading…');
    case 'no_nvml':
      return trans.__('NVML unavailable');
    case 'no_gpu':
      return trans.__('no GPU');
    case 'permission':
      return trans.__('no permission');
    case 'unreachable':
      return trans.__('unavailable');
    case 'error':
      return trans.__('error');
    default:
      return '';
  }
}

export interface GpuRow {
  info: GpuInfo;
  sample: GpuSample | null;
  /** total memory: the sample's, else the static value */
  memoryTotal: number | null;
}

/**
 * Static data joined with the newest sample, in index order, for the GPUs to show: the
 * session's, or those of the settings' `gpus` selection (selectGpus).
 */
export function gpuRows(
  gpus: GpusResponse,
  metrics: MetricsResponse | null,
  selection: string[] = []
): GpuRow[] {
  const byUuid = new Map((metrics?.gpus ?? []).map(s => [s.uuid, s]));
  return selectGpus(gpus.gpus, selection)
    .slice()
    .sort((a, b) => (a.index ?? 0) - (b.index ?? 0))
    .map(info => {
      const sample = byUuid.get(info.uuid) ?? null;
      return {
        info,
        sample,
        memoryTotal: sample?.memory_total_bytes ?? info.memory_total_bytes
      };
    });
}

/**
 * The status bar's text: "GPU 37% · 3.2/16.0 GiB" (one GPU), "2 GPUs 37% · …" (several; mean
 * utilisation, summed memory), "GPU n/a" utilisation on MIG, or the state ("GPU: no GPU").
 */
export function deriveStatus(
  gpus: GpusResponse | null,
  metrics: MetricsResponse | null,
  error: string | null = null,
  now: number = Date.now(),
  settings: ViewSettings = DEFAULT_SETTINGS,
  trans: Trans = untranslated
): StatusView {
  if (error !== null) {
    return { text: trans.__('GPU: unavailable'), title: error, level: 'error' };
  }
  if (gpus === null) {
    return { text: trans.__('GPU: …'), title: trans.__('Loading GPU data'), level: 'idle' };
  }
  const cull = cullWarning(gpus.culler, now, trans);
  if (sessionWithoutGpu(gpus)) {
    return {
      text: trans.__('GPU: no GPU'),
      title: [trans.__('This session has no GPU'), cull].filter(Boolean).join('\n'),
      level: cull ? 'warn' : 'idle'
    };
  }
  if (gpus.state !== 'ok') {
    const level: Level = gpus.state === 'no_gpu' ? 'idle' : 'error';
    return {
      text: trans.__('GPU: %1', stateText(gpus.state, trans)),
      title: [gpus.message || stateText(gpus.state, trans), cull].filter(Boolean).join('\n'),
      level: cull ? 'warn' : level
    };
  }
  const rows = gpuRows(gpus, metrics, settings.gpus);
  if (rows.length === 0 && settings.gpus.length > 0 && gpus.gpus.length > 0) {
    return {
      text: trans.__('GPU: none selected'),
      title: trans.__(
        'None of the GPUs in the settings (%1) is in this session',
        settings.gpus.join(', ')
      ),
      level: 'idle'
    };
  }
  if (rows.length === 0) {
    return {
      text: trans.__('GPU: no GPU'),
      title: gpus.message || trans.__('No GPU in this session'),
      level: 'idle'
    };
  }
  const utils = rows
    .map(r => r.sample?.utilization_percent ?? null)
    .filter((u): u is number => u !== null);
  const util = utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null;
  const used = rows.map(r => r.sample?.memory_used_bytes ?? null);
  const total = rows.map(r => r.memoryTotal);
  const usedSum = used.every(u => u !== null)
    ? (used as number[]).reduce((a, b) => a + b, 0)
    : null;
  const totalSum = total.every(t => t !== null)
    ? (total as number[]).reduce((a, b) => a + b, 0)
    : null;
  const label = trans._n('GPU', '%1 GPUs', rows.length);
  const units = settings.units;
  const mem = formatMemory(usedSum, totalSum, units, true);
  const text =
    metrics === null
      ? `${label} · ${formatMemory(null, totalSum, units, true)}`
      : `${label} ${formatPercent(util)} · ${mem}`;
  const lines = rows.map(
    r =>
      `#${r.info.index ?? '?'} ${r.info.name}: ${formatPercent(r.sample?.utilization_percent ?? null)}` +
      `${r.info.mig ? trans.__(' (MIG: utilisation not available)') : ''}, ` +
      formatMemory(r.sample?.memory_used_bytes ?? null, r.memoryTotal, units)
  );
  const warnings = [...gpus.warnings, ...(cull ? [cull] : [])];
  return {
    text,
    title: [...lines, ...warnings].join('\n'),
    level: warnings.length ? 'warn' : 'ok'
  };
}

/**
 * Whether the status bar item is shown: always, except in a session without a GPU (placed
 * without one, or a server that has none) when the `showWithoutGpu` setting is off. While the
 * data is loading or the server extension fails, the item stays (it says so).
 */
export function statusItemVisible(
  gpus: GpusResponse | null,
  error: string | null,
  settings: ViewSettings = DEFAULT_SETTINGS
): boolean {
  if (settings.showWithoutGpu || error !== null || gpus === null) {
    return true;
  }
  return !(sessionWithoutGpu(gpus) || (gpus.state === 'no_gpu' && gpus.gpus.length === 0));
}

/** A culler warning as a JupyterLab notification. */
export interface CullNotice {
  /** the same key means the same warning (status and due time): update it, do not repeat */
  key: string;
  /** the text: what will happen, the time left, the reason */
  message: string;
  /** the notification type */
  type: 'warning' | 'error';
}

/**
 * The notification for the culler's status of this server (cullWarning's text), or null when
 * nothing is scheduled. "culling" and "culled" are errors (the server stops), a scheduled cull
 * a warning.
 */
export function cullNotice(
  culler: CullerStatus | null,
  now: number = Date.now(),
  trans: Trans = untranslated
): CullNotice | null {
  const message = cullWarning(culler, now, trans);
  if (message === null || culler === null) {
    return null;
  }
  const status = culler.status.toLowerCase();
  return {
    key: `${status}|${culler.cull_at ?? ''}|${culler.reason ?? ''}`,
    message,
    type: status === 'culling' || status === 'culled' ? 'error' : 'warning'
  };
}

/** The culler's warning for this server, or null when nothing is scheduled. */
export function cullWarning(
  culler: CullerStatus | null,
  now: number = Date.now(),
  trans: Trans = untranslated
): string | null {
  if (culler === null) {
    return null;
  }
  const status = culler.status.toLowerCase();
  if (['ok', 'active', 'disabled', 'none', 'unknown', 'exempt'].includes(status)) {
    return null;
  }
  const at = parseTime(culler.cull_at);
  let when = '';
  if (at !== null) {
    const minutes = Math.round((at - now) / 60000);
    const clock = new Date(at).toISOString().slice(11, 16);
    when =
      minutes > 0
        ? trans.__(' in %1 min (at %2 UTC)', minutes, clock)
        : trans.__(' now (it was due at %1 UTC)', clock);
  }
  const reason = culler.reason ? `: ${culler.reason}` : '';
  if (status === 'culled') {
    return trans.__('The idle culler has stopped this server%1', reason);
  }
  if (status === 'culling') {
    return trans.__('The idle culler is stopping this server now%1. Save your work.', reason);
  }
  return trans.__(
    'This server will be stopped by the idle culler%1%2. Save your work.',
    when,
    reason
  );
}

/** One series of the history for a GPU, oldest first; the current sample is appended. */
export function historySeries(
  metrics: MetricsResponse | null,
  uuid: string,
  key: 'utilization_percent' | 'memory_used_bytes'
): (number | null)[] {
  if (metrics === null) {
    return [];
  }
  const points = metrics.history
    .slice()
    .sort((a, b) => (a.timestamp ?? 0) - (b.timestamp ?? 0))
    .map(h => h.gpus[uuid]?.[key] ?? null);
  const cur = metrics.gpus.find(g => g.uuid === uuid);
  const lastT = metrics.history.length
    ? Math.max(...metrics.history.map(h => h.timestamp ?? 0))
    : null;
  if (cur && (lastT === null || metrics.timestamp === null || metrics.timestamp > lastT)) {
    points.push(cur[key]);
  }
  return points;
}

/**
 * An SVG path ("M x y L x y …") of the values scaled into width × height with `max` at the
 * top; null values break the line. The newest value sits at the right edge.
 */
export function sparklinePath(
  values: (number | null)[],
  width: number,
  height: number,
  max: number,
  capacity: number = Math.max(values.length, 2)
): string {
  if (values.length === 0 || !(max > 0)) {
    return '';
  }
  const n = Math.max(capacity, values.length, 2);
  const step = width / (n - 1);
  const offset = n - values.length;
  const parts: string[] = [];
  let pen = false;
  values.forEach((v, i) => {
    if (v === null) {
      pen = false;
      return;
    }
    const x = (offset + i) * step;
    const y = height - (Math.min(Math.max(v, 0), max) / max) * height;
    parts.push(`${pen ? 'L' : 'M'}${x.toFixed(1)} ${y.toFixed(1)}`);
    pen = true;
  });
  return parts.join(' ');
}

export interface ProcessRow {
  gpu: string;
  pid: number;
  memory: string;
  memoryBytes: number | null;
  kernel: string;
}

/**
 * The processes on the session's GPUs, largest memory first. `kernelNames` maps a kernel id
 * to a label (the notebook's path); unmapped kernels show a short id, non-kernels "–".
 */
export function processRows(
  gpus: GpusResponse | null,
  metrics: MetricsResponse | null,
  kernelNames: Record<string, string> = {},
  settings: ViewSettings = DEFAULT_SETTINGS
): ProcessRow[] {
  if (metrics === null) {
    return [];
  }
  const infos = new Map((gpus?.gpus ?? []).map(g => [g.uuid, g]));
  const rows: ProcessRow[] = [];
  for (const s of metrics.gpus) {
    const info = infos.get(s.uuid);
    if (gpus && info === undefined && gpus.gpus.length > 0) {
      continue;
    }
    if (
      settings.gpus.length > 0 &&
      (info === undefined || !settings.gpus.some(e => gpuMatches(info, e)))
    ) {
      continue;
    }
    const gpu = info ? `#${info.index ?? '?'}` : s.uuid.slice(0, 12);
    for (const p of s.processes) {
      rows.push({
        gpu,
        pid: p.pid,
        memory: formatBytesIn(
          p.used_memory_bytes,
          settings.units === 'percent' ? 'auto' : settings.units
        ),
        memoryBytes: p.used_memory_bytes,
        kernel: p.kernel_id ? (kernelNames[p.kernel_id] ?? p.kernel_id.slice(0, 8)) : '–'
      });
    }
  }
  return rows.sort((a, b) => (b.memoryBytes ?? -1) - (a.memoryBytes ?? -1) || a.pid - b.pid);
}

/** The message the panel shows for a request that failed (HTTP status, network error). */
export function describeFetchError(
  path: string,
  status: number | null,
  detail = '',
  trans: Trans = untranslated
): string {
  if (status === 404) {
    return trans.__(
      'The gpuspawner server extension did not answer (HTTP 404 for %1). It is not installed or not enabled in this Jupyter server.',
      path
    );
  }
  if (status === 403 || status === 401) {
    return trans.__('Not allowed to read GPU data (HTTP %1 for %2).', status, path);
  }
  const more = detail ? `: ${detail}` : '';
  if (status !== null) {
    return trans.__('GPU data request failed (HTTP %1 for %2)%3.', status, path, more);
  }
  return trans.__('Could not reach the Jupyter server for GPU data%1.', more);
}
