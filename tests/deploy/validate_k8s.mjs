// Validates Kubernetes objects (JSON, one per line on stdin) against the Kubernetes OpenAPI
// schemas of npm's kubernetes-models, offline. Prints "ok KIND NAME" per object; exits 1 naming
// the first invalid one.
import { readFileSync } from "node:fs";
import * as core from "kubernetes-models/v1";
import * as apps from "kubernetes-models/apps/v1";
const kinds = { ...core, ...apps };
let status = 0;
for (const line of readFileSync(0, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const obj = JSON.parse(line);
  const Model = kinds[obj.kind];
  if (!Model || obj.apiVersion !== new Model({}).apiVersion) {
    console.log(`unknown ${obj.apiVersion} ${obj.kind}`);
    status = 1;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok ${obj.kind} ${obj.metadata.name}`);
  } catch (e) {
    console.log(`invalid ${obj.kind} ${obj.metadata && obj.metadata.name}: ${e.message}`);
    status = 1;
  }
}
process.exit(status);
