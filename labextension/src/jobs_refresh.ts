/**
 * The Notebook Jobs list of jupyter-scheduler follows the hub's jobs by itself.
 *
 * jupyter-scheduler 2.12's list (its Notebook Jobs panel) asks its server for the jobs when it
 * opens and when *Reload* is pressed, never on its own (its bundle has no timer on the list),
 * so a job that runs on the hub stayed "Queued" until the user pressed *Reload*. While the
 * panel is shown and a row of its job list is active (Queued, In progress, Stopping, Created),
 * this presses the list's *Reload* button every `intervalMs`; a list with only ended jobs,
 * a hidden panel (another tab in front, the Lab in a background tab: `document.hidden`) or a
 * job's detail view is left alone, so nothing is asked of the hub then. *Reload* keeps the
 * list's sort and filter (jupyter-scheduler copies its query), and the hub's `update_time` of
 * a job is its last change of state, so the rows' times follow.
 *
 * The words are jupyter-scheduler's English ones (its panel's strings; a translated Lab shows
 * others, and then the list refreshes only on *Reload*, as before).
 */

/** the class of jupyter-scheduler's Notebook Jobs panel (`NotebookJobsPanel`) */
export const JOBS_PANEL_CLASS = 'jp-notebook-jobs-panel';
/** the status words of a job that has not ended, as the list shows them */
export const ACTIVE_STATUS_WORDS = ['Queued', 'In progress', 'Stopping', 'Created'];
/** the text of the list's reload button */
export const RELOAD_WORD = 'Reload';
/** how often an active list is reloaded, milliseconds */
export const DEFAULT_INTERVAL_MS = 4000;

/** Whether one row's cells hold a status of a job that has not ended (a cell's whole text is
 * one of `ACTIVE_STATUS_WORDS`; a job's name that contains such a word does not count). */
export function rowIsActive(cellTexts: string[]): boolean {
  return cellTexts.some(t => ACTIVE_STATUS_WORDS.includes(t.trim()));
}

/** The reload button of a visible jobs list that shows an active job, or null. */
export function reloadButtonToPress(root: ParentNode): HTMLElement | null {
  for (const panel of Array.from(root.querySelectorAll<HTMLElement>(`.${JOBS_PANEL_CLASS}`))) {
    if (panel.offsetParent === null && panel.getClientRects().length === 0) {
      continue; // not shown
    }
    const rows = Array.from(panel.querySelectorAll('tbody tr'));
    const active = rows.some(row =>
      rowIsActive(Array.from(row.querySelectorAll('td')).map(td => td.textContent || ''))
    );
    if (!active) {
      continue;
    }
    const button = Array.from(panel.querySelectorAll<HTMLElement>('button')).find(
      b => (b.textContent || '').trim() === RELOAD_WORD
    );
    if (button) {
      return button;
    }
  }
  return null;
}

/** Presses the reload button of an active, visible jobs list every `intervalMs`. */
export class JobsRefresher {
  private timer: ReturnType<typeof setInterval> | null = null;

  constructor(
    private readonly doc: Document,
    readonly intervalMs: number = DEFAULT_INTERVAL_MS
  ) {}

  /** One look: press the button when there is one to press; returns whether it did. */
  tick(): boolean {
    if (this.doc.hidden) {
      return false;
    }
    const button = reloadButtonToPress(this.doc);
    if (button === null) {
      return false;
    }
    button.click();
    return true;
  }

  start(): void {
    if (this.timer === null) {
      this.timer = setInterval(() => this.tick(), this.intervalMs);
    }
  }

  stop(): void {
    if (this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }
}
