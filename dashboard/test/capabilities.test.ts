import { describe, expect, it } from "vitest";
import { capabilitiesByNode, hasProviders } from "../src/logic/capabilities";

describe("capabilities per node", () => {
  it("groups descriptors per node by name, sorted, with unreachable nodes' reasons", () => {
    const names = new Map([["n-b", "beta"], ["n-a", "alpha"]]);
    const groups = capabilitiesByNode({
      data: [
        { node_id: "n-b", ready: true, id: "text.upper", version: "1.0.0", mode: "unary", description: "upper" },
        { node_id: "n-a", ready: false, id: "echo.unary", version: "1.0.0", mode: "unary" },
        { node_id: "n-a", ready: true, id: "echo.duplex", version: "1.0.0", mode: "bidirectional" },
      ],
      unreachable: { "n-c-0123456789abcdef": "timed out" },
    }, names);
    expect(groups.map((g) => g.name)).toEqual(["alpha", "beta", "n-c-01234567"]);
    expect(groups[0]!.capabilities.map((c) => c.id)).toEqual(["echo.duplex", "echo.unary"]);
    expect(groups[2]).toMatchObject({ error: "timed out", capabilities: [] });
    expect(capabilitiesByNode({}, names)).toEqual([]);
  });
  it("shows the section only where the providers plugin is loaded", () => {
    expect(hasProviders({ runtime: { plugins: ["master", "providers"] } })).toBe(true);
    expect(hasProviders({ runtime: { plugins: ["master"] } })).toBe(false);
    expect(hasProviders(null)).toBe(false);
  });
});
