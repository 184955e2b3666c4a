# SPDX-License-Identifier: MIT
"""The Kubernetes manifests of packaging/k8s/ hold together, without a
cluster: each document is a known kind of a known API version, the
DaemonSet's selector selects its own pods, every volumeMount names a
volume of its pod, the daemon runs in the foreground with options shardfs
has (its man page's and, with SHARDFS_BIN, its --help's) on the store and
mount its hostPaths give it, the mount propagates (Bidirectional out of the
daemon, HostToContainer into the engine), /dev/fuse is there, the readiness
probe checks the daemon's own mount, the capacity fits the memory limit,
and the engine pod names the same mount, socket directory, store and
layout as the daemon."""
import json
import os
import posixpath
import re
import subprocess
import unittest

try:
    import yaml
except ImportError:  # python3-yaml: packaging/install-deps.sh
    yaml = None

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
K8S = os.path.join(ROOT, "packaging", "k8s")
DAEMONSET = os.path.join(K8S, "shardfs-daemonset.yaml")
ENGINE = os.path.join(K8S, "vllm-engine-pod.yaml")
SOCKET_DIR = "/run/shardfs"  # the daemon's default (fs/fs_i.h, SOCKET_DIR)

# The kinds the manifests may hold, with the API version each is served at.
API = {"Namespace": "v1", "Pod": "v1", "DaemonSet": "apps/v1"}
SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def size(s):
    """shardfs's SIZE (K/M/G, powers of 1024) or a Kubernetes quantity
    (Ki/Mi/Gi/Ti, or plain bytes): bytes."""
    m = re.fullmatch(r"([0-9]+)([KMGT]?)i?", str(s))
    if not m:
        raise ValueError(f"not a size: {s!r}")
    return int(m.group(1)) * SUFFIX[m.group(2)]


def man_options():
    """The -o names docs/shardfs.8 documents (store_low shares a line with
    store_high)."""
    with open(os.path.join(ROOT, "docs", "shardfs.8")) as f:
        man = f.read()
    return set(re.findall(r"\\-o ([a-z_]+)", man)) | set(re.findall(r'", ([a-z_]+)="', man))


def help_options():
    """The -o names the daemon's --help lists (its own and FUSE's), or None
    without SHARDFS_BIN."""
    bin_ = os.environ.get("SHARDFS_BIN")
    if not bin_:
        return None
    r = subprocess.run([bin_, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"^\s+-o ([a-z_]+)", r.stdout + r.stderr, re.M))


def volumes_by_name(pod_spec):
    vols = pod_spec.get("volumes", [])
    names = [v["name"] for v in vols]
    return names, {v["name"]: v for v in vols}


def host_mount(pod_spec, container, path):
    """The container's volumeMount at `path` and the hostPath it mounts
    (None when the mount's volume is not a hostPath)."""
    _, vols = volumes_by_name(pod_spec)
    for vm in container.get("volumeMounts", []):
        if vm["mountPath"] == path:
            hp = vols[vm["name"]].get("hostPath")
            return vm, hp
    return None, None


@unittest.skipIf(yaml is None, "no python3-yaml (packaging/install-deps.sh installs it)")
class Manifests(unittest.TestCase):
    def setUp(self):
        self.ds_docs = load(DAEMONSET)
        self.engine_docs = load(ENGINE)
        self.ds = next(d for d in self.ds_docs if d["kind"] == "DaemonSet")
        self.pod = self.ds["spec"]["template"]["spec"]
        self.daemon = next(c for c in self.pod["containers"] if c["name"] == "shardfs")
        self.engine = next(d for d in self.engine_docs if d["kind"] == "Pod")

    def daemon_args(self):
        """-f, the -o options as {name: value}, BACKEND_DIR, MOUNTPOINT."""
        args = list(self.daemon["args"])
        opts, pos, fg = {}, [], False
        it = iter(args)
        for a in it:
            if a == "-f":
                fg = True
            elif a == "-o":
                for kv in next(it).split(","):
                    k, _, v = kv.partition("=")
                    opts[k] = v
            elif a.startswith("-"):
                self.fail(f"the daemon's args hold {a!r}: only -f and -o are expected")
            else:
                pos.append(a)
        self.assertEqual(len(pos), 2, f"BACKEND_DIR MOUNTPOINT expected, got {pos}")
        return fg, opts, pos[0], pos[1]

    def test_every_document_is_a_known_kind_at_its_api_version(self):
        for path, docs in ((DAEMONSET, self.ds_docs), (ENGINE, self.engine_docs)):
            for d in docs:
                self.assertIn(d.get("kind"), API, f"{path}: kind {d.get('kind')!r}")
                self.assertEqual(d.get("apiVersion"), API[d["kind"]], f"{path}: {d['kind']}")
                self.assertTrue(d.get("metadata", {}).get("name"), f"{path}: {d['kind']} unnamed")
        ns = [d["metadata"]["name"] for d in self.ds_docs if d["kind"] == "Namespace"]
        self.assertEqual(self.ds["metadata"].get("namespace", "default"),
                         ns[0] if ns else "default", "the DaemonSet's namespace is not created")

    def test_the_daemonsets_selector_matches_its_template(self):
        sel = self.ds["spec"]["selector"]["matchLabels"]
        labels = self.ds["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(sel)
        for k, v in sel.items():
            self.assertEqual(labels.get(k), v, f"selector {k}={v} does not select the template")

    def test_every_volume_mount_names_a_volume_of_its_pod(self):
        for what, spec in (("DaemonSet", self.pod), ("engine pod", self.engine["spec"])):
            names, vols = volumes_by_name(spec)
            self.assertEqual(len(names), len(set(names)), f"{what}: a volume name twice")
            for c in spec["containers"]:
                paths = [vm["mountPath"] for vm in c.get("volumeMounts", [])]
                self.assertEqual(len(paths), len(set(paths)), f"{what}: a mount path twice")
                for vm in c.get("volumeMounts", []):
                    self.assertIn(vm["name"], vols, f"{what}/{c['name']}: no volume {vm['name']}")

    def test_the_daemon_runs_in_the_foreground_with_real_options(self):
        fg, opts, _, _ = self.daemon_args()
        self.assertTrue(fg, "without -f the daemon detaches and the container exits")
        known = man_options()
        for k in opts:
            self.assertIn(k, known, f"-o {k} is not in docs/shardfs.8")
        from_help = help_options()
        if from_help is not None:
            for k in opts:
                self.assertIn(k, from_help, f"-o {k} is not in shardfs --help")
        # The wrapper hands the args to the daemon as they are.
        script = self.daemon["command"]
        self.assertEqual(script[:2], ["/bin/sh", "-c"])
        self.assertIn('exec shardfs "$@"', script[2])

    def test_the_daemon_can_mount_fuse(self):
        self.assertTrue(self.daemon.get("securityContext", {}).get("privileged"),
                        "mount(2) and Bidirectional propagation need a privileged container")
        vm, hp = host_mount(self.pod, self.daemon, "/dev/fuse")
        self.assertIsNotNone(vm, "no /dev/fuse in the daemon's container")
        self.assertEqual(hp, {"path": "/dev/fuse", "type": "CharDevice"})

    def test_store_mount_and_socket_directory_are_the_hosts(self):
        _, opts, store, mnt = self.daemon_args()
        vm, hp = host_mount(self.pod, self.daemon, mnt)
        self.assertIsNotNone(hp, f"the mount point {mnt} is not a hostPath")
        self.assertEqual(hp["path"], mnt, "the node's mount point differs from the daemon's")
        self.assertEqual(vm.get("mountPropagation"), "Bidirectional",
                         "the FUSE mount would not reach the node")
        vm, hp = host_mount(self.pod, self.daemon, store)
        self.assertIsNotNone(hp, f"the store {store} is not a hostPath")
        self.assertEqual(hp["path"], store)
        sock_dir = posixpath.dirname(opts["socket"]) if "socket" in opts else SOCKET_DIR
        vm, hp = host_mount(self.pod, self.daemon, sock_dir)
        self.assertIsNotNone(hp, f"the socket directory {sock_dir} is not a hostPath")
        self.assertEqual(hp["path"], sock_dir)
        self.assertTrue(self.pod.get("hostPID"),
                        "outside the host's pid namespace every engine process reads as pid 0")

    def test_the_readiness_probe_checks_the_daemons_mount(self):
        _, _, _, mnt = self.daemon_args()
        cmd = self.daemon["readinessProbe"]["exec"]["command"]
        self.assertEqual(cmd[:2], ["shardfsctl", "check"])
        rest = cmd[2:]
        if rest[:1] == ["-t"]:
            self.assertGreater(int(rest[1]), 0)
            rest = rest[2:]
        self.assertEqual(rest, [mnt], "the probe checks another path than the daemon's mount")
        # The probe's deadline is within the kubelet's.
        t = int(cmd[cmd.index("-t") + 1]) if "-t" in cmd else 5
        self.assertLess(t, self.daemon["readinessProbe"].get("timeoutSeconds", 1))

    def test_the_capacity_fits_the_memory_limit(self):
        _, opts, _, _ = self.daemon_args()
        cap = size(opts.get("capacity", "1G"))
        limit = size(self.daemon["resources"]["limits"]["memory"])
        self.assertLess(cap, limit, "the daemon refuses a capacity above its memory limit")
        self.assertEqual(opts.get("hugepages"), "off",
                         "huge pages need a hugepages-2Mi resource; the example uses none")

    def test_the_image_is_the_one_the_dockerfile_builds(self):
        with open(os.path.join(K8S, "Dockerfile")) as f:
            dockerfile = f.read()
        self.assertIn(f"-t {self.daemon['image']} ", dockerfile)

    def test_the_engine_pod_uses_the_daemons_paths(self):
        _, opts, store, mnt = self.daemon_args()
        spec = self.engine["spec"]
        self.assertEqual(spec.get("nodeSelector"), self.pod.get("nodeSelector"),
                         "the engine may land on a node without the daemon")
        c = spec["containers"][0]
        args = c["args"]
        cfg = json.loads(args[args.index("--kv-transfer-config") + 1])
        self.assertEqual(cfg["kv_connector"], "OffloadingConnector")
        extra = cfg["kv_connector_extra_config"]
        self.assertEqual((extra["spec_module_path"], extra["spec_name"]),
                         ("shardfs.vllm", "ShardfsOffloadingSpec"))
        with open(os.path.join(ROOT, "gpu", "python", "shardfs", "vllm.py")) as f:
            self.assertIn("class ShardfsOffloadingSpec(", f.read())
        self.assertEqual(extra["shardfs_mount"], mnt)
        self.assertEqual(extra["shardfs_store"], store)
        self.assertEqual(int(extra.get("dir_prefix", 0)), int(opts.get("dir_prefix", 0)))
        vm, hp = host_mount(spec, c, mnt)
        self.assertIsNotNone(hp, f"the engine does not mount the node's {mnt}")
        self.assertEqual(hp["path"], mnt)
        self.assertEqual(vm.get("mountPropagation"), "HostToContainer",
                         "a daemon mounting after the engine started would not be seen")
        sock_dir = posixpath.dirname(opts["socket"]) if "socket" in opts else SOCKET_DIR
        vm, hp = host_mount(spec, c, sock_dir)
        self.assertIsNotNone(hp, f"the engine does not mount the socket directory {sock_dir}")
        self.assertEqual(hp["path"], sock_dir)
        vm, hp = host_mount(spec, c, store)
        self.assertIsNotNone(hp, f"the engine does not mount the store {store}")
        self.assertEqual(hp["path"], store)
        self.assertFalse(vm.get("readOnly"), "workers store to the store (write-through)")

    def test_the_engine_may_attach(self):
        """Root always may; another user through the daemon's attach_gid or
        attach_uids."""
        _, opts, _, _ = self.daemon_args()
        spec = self.engine["spec"]
        sc = dict(spec.get("securityContext", {}))
        sc.update(spec["containers"][0].get("securityContext", {}))
        uid = sc.get("runAsUser")
        if uid in (None, 0):
            return  # the image's user: root in vLLM's images
        gids = [sc.get("runAsGroup")] + list(sc.get("supplementalGroups", []))
        allowed = ("attach_gid" in opts and int(opts["attach_gid"]) in gids) or \
            str(uid) in opts.get("attach_uids", "").split(":")
        self.assertTrue(allowed, f"uid {uid} may not attach: see docs/security.md")


class Sizes(unittest.TestCase):
    def test_sizes_parse_as_the_daemon_and_kubernetes_read_them(self):
        self.assertEqual(size("256K"), 256 << 10)
        self.assertEqual(size("16G"), 16 << 30)
        self.assertEqual(size("17Gi"), 17 << 30)
        self.assertEqual(size("4096"), 4096)
        with self.assertRaises(ValueError):
            size("1.5G")


if __name__ == "__main__":
    unittest.main()
