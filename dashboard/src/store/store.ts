/**
 * One small store for the whole app: a value, a setter and subscribers.
 *
 * React reads it through `useSyncExternalStore`, so a component re-renders only when the slice it
 * selects changes (selectors return stable references from the store, never fresh objects).
 */

import { useSyncExternalStore } from "react";

export interface Store<T> {
  get(): T;
  set(patch: Partial<T> | ((current: T) => Partial<T>)): void;
  subscribe(listener: () => void): () => void;
}

export function createStore<T extends object>(initial: T): Store<T> {
  let value = initial;
  const listeners = new Set<() => void>();
  return {
    get: () => value,
    set(patch) {
      const next = typeof patch === "function" ? patch(value) : patch;
      const changed = Object.keys(next).some((k) => next[k as keyof T] !== value[k as keyof T]);
      if (!changed) return;
      value = { ...value, ...next };
      for (const listener of [...listeners]) listener();
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}

export function useStore<T, S>(store: Store<T>, select: (value: T) => S): S {
  return useSyncExternalStore(store.subscribe, () => select(store.get()), () => select(store.get()));
}
