// Side-by-side differences between two versions: their SQL line by line, and their output columns.
import { diffLines } from 'diff';
import type { Column } from './api';

export type RowKind = 'same' | 'changed' | 'removed' | 'added';

/** One line of the side-by-side view; a side is null where that version has no line. */
export interface DiffRow {
  kind: RowKind;
  left: string | null;
  right: string | null;
}

function lines(text: string): string[] {
  const split = text.split('\n');
  if (split.at(-1) === '') split.pop();
  return split;
}

/** The two texts side by side: removed lines face the lines added in their place. */
export function sideBySide(before: string, after: string): DiffRow[] {
  const rows: DiffRow[] = [];
  let removed: string[] = [];
  const flush = (added: string[]) => {
    const n = Math.max(removed.length, added.length);
    for (let i = 0; i < n; i++) {
      const left = removed[i] ?? null;
      const right = added[i] ?? null;
      rows.push({ kind: left !== null && right !== null ? 'changed' : left !== null ? 'removed' : 'added', left, right });
    }
    removed = [];
  };
  // Every line ends with a newline, so that a last line without one is not a change.
  const normalized = (text: string) => `${text.replace(/\r\n/g, '\n').replace(/\n*$/, '')}\n`;
  for (const change of diffLines(normalized(before), normalized(after))) {
    const changed = lines(change.value);
    if (change.removed) {
      removed.push(...changed);
    } else if (change.added) {
      flush(changed);
    } else {
      flush([]);
      rows.push(...changed.map((line) => ({ kind: 'same' as const, left: line, right: line })));
    }
  }
  flush([]);
  return rows;
}

export interface ColumnChange {
  name: string;
  kind: 'same' | 'added' | 'removed' | 'retyped';
  before: string | null;
  after: string | null;
}

/** How the output columns changed: in the newer version's order, then the columns it no longer has. */
export function columnChanges(before: Column[] | null, after: Column[] | null): ColumnChange[] {
  const old = new Map((before ?? []).map((c) => [c.name, c.type]));
  const now = new Map((after ?? []).map((c) => [c.name, c.type]));
  const changes: ColumnChange[] = (after ?? []).map((c) => {
    const was = old.get(c.name) ?? null;
    return { name: c.name, kind: was === null ? 'added' : was === c.type ? 'same' : 'retyped', before: was, after: c.type };
  });
  for (const c of before ?? []) {
    if (!now.has(c.name)) changes.push({ name: c.name, kind: 'removed', before: c.type, after: null });
  }
  return changes;
}

/** An output column a version removed or retyped against the version before it, as the server records it. */
export interface BreakingChange {
  column: string;
  change: 'removed' | 'type_changed';
  from: string;
  to: string | null;
}

/** The breaking changes of a version in words, one sentence. */
export function breakingText(changes: BreakingChange[]): string {
  const parts = changes.map((c) =>
    c.change === 'removed' ? `${c.column} (${c.from}) removed` : `${c.column} changed from ${c.from} to ${c.to}`,
  );
  return `Breaks callers of the version before: ${parts.join('; ')}.`;
}
