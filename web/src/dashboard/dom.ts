// A little help building the page's elements: text is always set as text, never parsed as
// HTML, so nothing an event or a row holds can become markup.

type Attributes = Record<string, string | number | boolean | undefined>;
type Child = Node | string | number | null | undefined | false;

/** An element with its attributes (`false` and `undefined` leave one out) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Attributes = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === false) continue;
    element.setAttribute(name, value === true ? '' : String(value));
  }
  append(element, children);
  return element;
}

/** Adds `children` to `parent`, text as text. */
export function append(parent: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces every child of `parent`. */
export function replace(parent: Node, ...children: Child[]): void {
  parent.textContent = '';
  append(parent, children);
}

/** The element with `id`, which the page must have. */
export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const element = document.getElementById(id);
  if (!element) throw new Error(`the page has no #${id}`);
  return element as T;
}

/** A number with thousands separated, as people read it. */
export function count(value: number): string {
  return new Intl.NumberFormat('en').format(value);
}

/** A time of day in the reader's locale (the full instant in its title). */
export function timeOf(instant: string): HTMLTimeElement {
  const date = new Date(instant);
  return h('time', { datetime: instant, title: date.toISOString() }, date.toLocaleTimeString());
}

/** `work`, run `ms` after the last call (later calls join the wait); `cancel` drops a wait. */
export function debounce(work: () => void, ms: number): { call: () => void; cancel: () => void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const cancel = () => {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
  };
  const call = () => {
    cancel();
    timer = setTimeout(() => {
      timer = undefined;
      work();
    }, ms);
  };
  return { call, cancel };
}
