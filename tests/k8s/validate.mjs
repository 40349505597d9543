// Schema validation of Kubernetes custom resources, for tests/test_k8s_manifests.py.
//
//   node tests/k8s/validate.mjs < objects.json     (a JSON array of objects)
//
// Prints a JSON array, one result per object in input order:
//   {index, apiVersion, kind, name, validator, ok, errors}
// validator is the package (and version) whose schema judged the object, or null when no
// schema here knows its apiVersion and kind (ok is then false). Exit status 0 whenever the
// input could be read; the caller judges the results.
//
// - Istio, KEDA, Gateway API, prometheus-operator: the @kubernetes-models/* classes, whose
//   validate() checks the object against the project's published CRD (or Go-type) schema.
// - Envoy Gateway (gateway.envoyproxy.io): no registry package ships its CRDs, so their
//   openAPIV3Schema is kept in crds/envoy-gateway.json (see crds/extract.py) and checked with
//   Ajv. Unknown fields are errors there, as the API server's strict field validation (what
//   kubectl apply asks for by default) makes them; CEL rules (x-kubernetes-validations) are
//   not evaluated.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const require = createRequire(import.meta.url);
const here = new URL(".", import.meta.url);

// API group → the @kubernetes-models package that holds its classes (at GROUP/VERSION/KIND).
const MODEL_PACKAGES = {
  "networking.istio.io": "@kubernetes-models/istio",
  "security.istio.io": "@kubernetes-models/istio",
  "telemetry.istio.io": "@kubernetes-models/istio",
  "extensions.istio.io": "@kubernetes-models/istio",
  "keda.sh": "@kubernetes-models/keda",
  "eventing.keda.sh": "@kubernetes-models/keda",
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "gateway.networking.x-k8s.io": "@kubernetes-models/gateway-api",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

function packageVersion(name) {
  return JSON.parse(readFileSync(require.resolve(`${name}/package.json`), "utf8")).version;
}

// ---- Envoy Gateway: vendored CRD schemas, strict on unknown fields ----

const egFile = JSON.parse(readFileSync(new URL("crds/envoy-gateway.json", here), "utf8"));
const egSource = egFile._source.split(",")[0]; // "github.com/envoyproxy/gateway vX.Y.Z (...)"

// An object schema that lists its properties and neither allows extra ones nor preserves
// unknown fields rejects the fields it does not list (the API server's strict decoding).
// Branches of allOf/anyOf/oneOf only constrain fields declared beside them: left as they are.
function strictify(schema) {
  if (schema === null || typeof schema !== "object") return schema;
  const out = { ...schema };
  if (out.properties) {
    out.properties = Object.fromEntries(
      Object.entries(out.properties).map(([k, v]) => [k, strictify(v)]),
    );
    if (out.additionalProperties === undefined && !out["x-kubernetes-preserve-unknown-fields"]) {
      out.additionalProperties = false;
    }
  }
  if (out.items) out.items = strictify(out.items);
  if (out.additionalProperties && typeof out.additionalProperties === "object") {
    out.additionalProperties = strictify(out.additionalProperties);
  }
  return out;
}

const DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
// CRD schemas say only `metadata: {type: object}`; the API server checks these itself.
const METADATA = {
  type: "object",
  required: ["name"],
  properties: {
    name: { type: "string", maxLength: 253, pattern: DNS_SUBDOMAIN },
    namespace: { type: "string", maxLength: 63, pattern: DNS_LABEL },
    labels: { type: "object", additionalProperties: { type: "string" } },
    annotations: { type: "object", additionalProperties: { type: "string" } },
  },
};

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
ajv.addFormat("int32", { type: "number", validate: (n) => Number.isInteger(n) && Math.abs(n) <= 2 ** 31 });
ajv.addFormat("int64", { type: "number", validate: (n) => Number.isInteger(n) });
ajv.addFormat("byte", /^[A-Za-z0-9+/]*={0,2}$/);
const egValidators = new Map();
function egValidator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (!egValidators.has(key)) {
    const schema = egFile.schemas[key];
    if (!schema) return null;
    const strict = strictify(schema);
    strict.properties = { ...strict.properties, metadata: METADATA };
    strict.required = [...new Set([...(strict.required || []), "apiVersion", "kind", "metadata"])];
    egValidators.set(key, ajv.compile(strict));
  }
  return egValidators.get(key);
}

// ---- one object ----

async function validateOne(obj, index) {
  const apiVersion = String(obj?.apiVersion ?? "");
  const kind = String(obj?.kind ?? "");
  const res = { index, apiVersion, kind, name: obj?.metadata?.name ?? null, validator: null, ok: false, errors: [] };
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "gateway.envoyproxy.io") {
    const validate = egValidator(apiVersion, kind);
    if (!validate) {
      res.errors.push(`no Envoy Gateway CRD schema for ${apiVersion} ${kind} in crds/envoy-gateway.json`);
      return res;
    }
    res.validator = `ajv ${packageVersion("ajv")} + CRD schema ${egSource}`;
    res.ok = validate(obj);
    if (!res.ok) res.errors = validate.errors.map((e) => `${e.instancePath || "/"} ${e.message}${e.params?.additionalProperty ? `: ${e.params.additionalProperty}` : ""}${e.params?.allowedValues ? ` ${JSON.stringify(e.params.allowedValues)}` : ""}`);
    return res;
  }
  const pkg = MODEL_PACKAGES[group];
  if (!pkg || !/^[A-Za-z0-9]+$/.test(version) || !/^[A-Za-z0-9]+$/.test(kind)) {
    res.errors.push(`no schema for ${apiVersion} ${kind} (unknown API group or kind)`);
    return res;
  }
  let Model;
  try {
    Model = (await import(`${pkg}/${group}/${version}/${kind}`))[kind];
  } catch {
    Model = undefined;
  }
  if (typeof Model !== "function") {
    res.errors.push(`no schema for ${apiVersion} ${kind} in ${pkg}`);
    return res;
  }
  res.validator = `${pkg} ${packageVersion(pkg)}`;
  try {
    new Model(obj).validate();
    res.ok = true;
  } catch (e) {
    res.errors.push(String(e?.message ?? e));
  }
  return res;
}

const input = JSON.parse(readFileSync(0, "utf8"));
if (!Array.isArray(input)) {
  process.stderr.write("validate.mjs: stdin must be a JSON array of objects\n");
  process.exit(2);
}
const results = await Promise.all(input.map(validateOne));
process.stdout.write(JSON.stringify(results) + "\n");
