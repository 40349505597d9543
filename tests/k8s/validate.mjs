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
// - Envoy Gateway (gateway.envoyproxy.io): no registry package ships its CRDs, so ICE keeps its
//   own JSON Schema of the parts of Envoy Gateway v1.9's API that ICE's manifests use,
//   crds/envoy-gateway-ice.json (written from EG's API reference, not taken from its CRDs), and
//   checks with Ajv against it. An EG kind it does not describe has no schema (ok false). Every
//   object there lists its fields and allows no others, so an unknown or misspelt field is an
//   error (stricter than the kubernetes-models validators, and than EG for fields ICE does not
//   use); some of EG's CEL rules are restated there, the others are not checked.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import Ajv from "ajv";

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

// ---- Envoy Gateway: ICE's own schema ----

const EG_FILE = "crds/envoy-gateway-ice.json";
const egSchema = JSON.parse(readFileSync(new URL(EG_FILE, here), "utf8"));
// Strict: a keyword Ajv does not know, or one without the type it applies to, is an error in
// the schema itself (a misspelt `additionalProperties` would otherwise allow every field).
// Not strictRequired: `required` in if/then names fields declared beside it, or on purpose
// fields the schema does not describe (EG's `http` of an HTTP health check).
const egAjv = new Ajv({ strict: true, strictRequired: false, allErrors: true });
egAjv.addKeyword("_note").addKeyword("kinds");
egAjv.addSchema(egSchema);
const egValidators = new Map();
function egValidator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  const ref = Object.hasOwn(egSchema.kinds, key) ? egSchema.kinds[key] : undefined;
  if (!ref) return null;
  if (!egValidators.has(key)) egValidators.set(key, egAjv.compile({ $ref: egSchema.$id + ref }));
  return egValidators.get(key);
}

function ajvMessage(e) {
  const extra = e.params?.additionalProperty
    ? `: ${e.params.additionalProperty}`
    : e.params?.allowedValues
      ? ` ${JSON.stringify(e.params.allowedValues)}`
      : e.params?.allowedValue !== undefined
        ? ` ${JSON.stringify(e.params.allowedValue)}`
        : "";
  return `${e.instancePath || "/"} ${e.message}${extra}`;
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
      res.errors.push(
        `no schema for ${apiVersion} ${kind} in ${EG_FILE} ` +
          "(ICE's schema of Envoy Gateway describes only the kinds ICE uses)",
      );
      return res;
    }
    res.validator = `ajv ${packageVersion("ajv")} + ICE's Envoy Gateway schema ${EG_FILE}`;
    res.ok = validate(obj);
    if (!res.ok) res.errors = validate.errors.map(ajvMessage);
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
