//! cri-client: drives a CRI runtime (containerd's CRI plugin) over its unix socket the way
//! kubelet does, so that CNI plugins see kubelet's CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME,
//! K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID) and runtimeConfig.
//!
//! Socket: `$CRI_SOCK` (default /run/containerd/containerd.sock).
//! Pod log directories: under `$CRI_LOG_DIR` (default /tmp/cri-client-logs).
//!
//! ```text
//! cri-client version                             runtime name, version, API version
//! cri-client runp NAME NAMESPACE UID [H:C[/udp]..] [KEY=VALUE..]
//!                                                RunPodSandbox with these port mappings and
//!                                                pod annotations, prints the sandbox id
//! cri-client ip POD                              the pod's IPv4 address as CRI reports it
//! cri-client stopp POD | rmp POD                 StopPodSandbox | RemovePodSandbox
//! cri-client lsp                                 "id namespace/name state" per sandbox
//! cri-client cniconfig                           the CNI configuration the runtime has loaded
//!                                                (verbose Status, info["cniconfig"])
//! cri-client run POD IMAGE CMD [ARG..]           create + start a container in POD, wait for
//!                                                it, print its output, remove it, exit with
//!                                                the container's exit code
//! cri-client runspec NAME NAMESPACE UID HOSTNET IMAGE RO_ROOT NO_NEW_PRIVS PRIVILEGED
//!            RUN_AS_USER SECCOMP CAP_ADD CAP_DROP [--mount HOST:CTR:ro|rw:PROPAGATION]..
//!            [--env K=V].. -- [COMMAND..] [-- ARGS..]
//!                                                a long-running container as kubelet would
//!                                                create it from a pod template (the caller
//!                                                translates the template: CAP_ADD/CAP_DROP are
//!                                                comma-separated, "-" for none; SECCOMP is
//!                                                RuntimeDefault, Unconfined or "-"; PROPAGATION
//!                                                None, HostToContainer or Bidirectional);
//!                                                prints "SANDBOX_ID CONTAINER_ID"
//! cri-client exec CONTAINER TIMEOUT CMD [ARG..]    ExecSync, as kubelet runs an exec probe:
//!                                                prints its stdout (stderr to stderr), exits
//!                                                with its exit code
//! cri-client pid CONTAINER                       the container's init pid (verbose status)
//! ```
use std::collections::HashMap;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: cri-client version | runp NAME NAMESPACE UID [HOST:CTR[/udp]...] [KEY=VALUE...] | ip POD | stopp POD | rmp POD | lsp | cniconfig | run POD IMAGE CMD [ARG...] | runspec ... | exec CONTAINER TIMEOUT CMD [ARG...] | pid CONTAINER";

async fn connect(sock: String) -> Result<Channel, Error> {
    // The URI is ignored: every connection goes to the unix socket.
    let ch = Endpoint::try_from("http://cri.invalid")?
        .timeout(Duration::from_secs(120))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move { UnixStream::connect(sock).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(ch)
}

fn log_dir(ns: &str, name: &str, uid: &str) -> String {
    let base = std::env::var("CRI_LOG_DIR").unwrap_or_else(|_| "/tmp/cri-client-logs".into());
    format!("{base}/{ns}_{name}_{uid}")
}

fn port_mapping(spec: &str) -> Result<PortMapping, Error> {
    let (ports, proto) = spec.split_once('/').unwrap_or((spec, "tcp"));
    let (host, ctr) = ports
        .split_once(':')
        .ok_or_else(|| format!("port mapping {spec:?}: want HOST:CONTAINER[/tcp|udp]"))?;
    let protocol = match proto {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        other => return Err(format!("port mapping {spec:?}: unknown protocol {other:?}").into()),
    };
    Ok(PortMapping {
        protocol: protocol as i32,
        container_port: ctr.parse()?,
        host_port: host.parse()?,
        host_ip: String::new(),
    })
}

/// The sandbox config kubelet would send for a pod (the parts CNI cares about).
fn sandbox_config(
    name: &str,
    ns: &str,
    uid: &str,
    ports: Vec<PortMapping>,
    annotations: HashMap<String, String>,
) -> PodSandboxConfig {
    sandbox_config_net(name, ns, uid, ports, annotations, false)
}

/// As [`sandbox_config`]; `host_network`: the pod shares the runtime's network namespace
/// (`hostNetwork: true`), and CNI is not called for it.
fn sandbox_config_net(
    name: &str,
    ns: &str,
    uid: &str,
    ports: Vec<PortMapping>,
    annotations: HashMap<String, String>,
    host_network: bool,
) -> PodSandboxConfig {
    let labels: HashMap<String, String> = [
        ("io.kubernetes.pod.name", name),
        ("io.kubernetes.pod.namespace", ns),
        ("io.kubernetes.pod.uid", uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: ns.into(),
            attempt: 0,
        }),
        // The node's own name on the host network (the kubelet sets none: no UTS namespace).
        hostname: if host_network {
            String::new()
        } else {
            name.into()
        },
        log_directory: log_dir(ns, name, uid),
        port_mappings: ports,
        labels,
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: if host_network {
                        NamespaceMode::Node as i32
                    } else {
                        NamespaceMode::Pod as i32
                    },
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn pod_status(
    rt: &mut RuntimeServiceClient<Channel>,
    pod: &str,
) -> Result<PodSandboxStatus, Error> {
    let req = PodSandboxStatusRequest {
        pod_sandbox_id: pod.into(),
        verbose: false,
    };
    let st = rt.pod_sandbox_status(req).await?.into_inner().status;
    Ok(st.ok_or_else(|| format!("pod {pod}: no status"))?)
}

async fn run_container(
    ch: Channel,
    pod: &str,
    image: &str,
    cmd: Vec<String>,
) -> Result<i32, Error> {
    let mut rt = RuntimeServiceClient::new(ch.clone());
    let mut img = ImageServiceClient::new(ch);
    let st = pod_status(&mut rt, pod).await?;
    let annotations = st.annotations.clone();
    let md = st.metadata.unwrap_or_default();
    let spec = ImageSpec {
        image: image.into(),
        ..Default::default()
    };
    let have = img
        .image_status(ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await?
        .into_inner();
    if have.image.is_none() {
        return Err(
            format!("image {image} is not in the CRI image store (k8s.io namespace)").into(),
        );
    }
    let dir = log_dir(&md.namespace, &md.name, &md.uid);
    std::fs::create_dir_all(&dir)?;
    let cname = format!("c{}", std::process::id());
    let log_path = format!("{cname}.log");
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: cname.clone(),
            attempt: 0,
        }),
        image: Some(spec),
        command: cmd,
        log_path: log_path.clone(),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    };
    let sandbox = sandbox_config(&md.name, &md.namespace, &md.uid, vec![], annotations);
    let id = rt
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        })
        .await?
        .into_inner()
        .container_id;
    rt.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await?;
    let mut code = None;
    // Poll until the container exits (bounded: 60 s).
    for _ in 0..1200 {
        let req = ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        };
        let s = rt.container_status(req).await?.into_inner().status;
        if let Some(s) = s {
            if s.state == ContainerState::ContainerExited as i32 {
                code = Some(s.exit_code);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // CRI log lines: "<timestamp> <stdout|stderr> <P|F> <text>".
    let log = std::fs::read_to_string(format!("{dir}/{log_path}")).unwrap_or_default();
    for line in log.lines() {
        let text = line.splitn(4, ' ').nth(3).unwrap_or("");
        println!("{text}");
    }
    if code.is_none() {
        let req = StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        };
        let _ = rt.stop_container(req).await;
    }
    rt.remove_container(RemoveContainerRequest { container_id: id })
        .await?;
    code.ok_or_else(|| "container did not exit within 60 s".into())
}

fn list(s: &str) -> Vec<String> {
    if s == "-" || s.is_empty() {
        return Vec::new();
    }
    s.split(',').map(str::to_string).collect()
}

fn propagation(s: &str) -> Result<i32, Error> {
    Ok(match s {
        "None" => MountPropagation::PropagationPrivate as i32,
        "HostToContainer" => MountPropagation::PropagationHostToContainer as i32,
        "Bidirectional" => MountPropagation::PropagationBidirectional as i32,
        other => return Err(format!("mount propagation {other:?}").into()),
    })
}

/// `runspec`: a sandbox and a long-running container, created the way kubelet creates them
/// from a pod template's fields.
async fn run_spec(ch: Channel, args: &[String]) -> Result<i32, Error> {
    let arg = |i: usize| -> Result<&str, Error> {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| USAGE.into())
    };
    let (name, ns, uid) = (arg(0)?, arg(1)?, arg(2)?);
    let host_network = arg(3)? == "true";
    let image = arg(4)?;
    let readonly_rootfs = arg(5)? == "true";
    let no_new_privs = arg(6)? == "true";
    let privileged = arg(7)? == "true";
    let run_as_user: i64 = arg(8)?.parse()?;
    let seccomp = match arg(9)? {
        "RuntimeDefault" => Some(SecurityProfile {
            profile_type: security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        "Unconfined" => Some(SecurityProfile {
            profile_type: security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        }),
        "-" => None,
        other => return Err(format!("seccomp profile {other:?}").into()),
    };
    let (cap_add, cap_drop) = (list(arg(10)?), list(arg(11)?));
    let mut mounts = Vec::new();
    let mut envs = Vec::new();
    let mut i = 12;
    while i < args.len() && args[i] != "--" {
        let v = args.get(i + 1).ok_or(USAGE)?;
        match args[i].as_str() {
            "--mount" => {
                let parts: Vec<&str> = v.split(':').collect();
                let [host, ctr, mode, prop] = parts[..] else {
                    return Err(format!("--mount {v:?}: want HOST:CTR:ro|rw:PROPAGATION").into());
                };
                mounts.push(Mount {
                    container_path: ctr.into(),
                    host_path: host.into(),
                    readonly: mode == "ro",
                    selinux_relabel: false,
                    propagation: propagation(prop)?,
                    ..Default::default()
                });
            }
            "--env" => {
                let (k, val) = v.split_once('=').ok_or("--env wants K=V")?;
                envs.push(KeyValue {
                    key: k.into(),
                    value: val.into(),
                });
            }
            other => return Err(format!("unknown runspec option {other:?}").into()),
        }
        i += 2;
    }
    // "--" COMMAND.. ["--" ARGS..]
    let rest: Vec<String> = args.get(i + 1..).unwrap_or_default().to_vec();
    let (command, cargs) = match rest.iter().position(|a| a == "--") {
        Some(p) => (rest[..p].to_vec(), rest[p + 1..].to_vec()),
        None => (rest.clone(), Vec::new()),
    };
    let mut rt = RuntimeServiceClient::new(ch.clone());
    let mut img = ImageServiceClient::new(ch);
    let spec = ImageSpec {
        image: image.into(),
        ..Default::default()
    };
    let have = img
        .image_status(ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await?
        .into_inner();
    if have.image.is_none() {
        return Err(format!("image {image} is not in the CRI image store").into());
    }
    let sandbox = sandbox_config_net(name, ns, uid, vec![], HashMap::new(), host_network);
    std::fs::create_dir_all(log_dir(ns, name, uid))?;
    let pod = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let namespace_options = Some(NamespaceOption {
        network: if host_network {
            NamespaceMode::Node as i32
        } else {
            NamespaceMode::Pod as i32
        },
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    });
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(spec),
        command,
        args: cargs,
        envs,
        mounts,
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                capabilities: Some(Capability {
                    add_capabilities: cap_add,
                    drop_capabilities: cap_drop,
                    ..Default::default()
                }),
                privileged,
                namespace_options,
                run_as_user: Some(Int64Value { value: run_as_user }),
                readonly_rootfs,
                no_new_privs,
                seccomp,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = rt
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        })
        .await?
        .into_inner()
        .container_id;
    rt.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await?;
    println!("{pod} {id}");
    Ok(0)
}

async fn real_main(args: Vec<String>) -> Result<i32, Error> {
    let arg =
        |i: usize| -> Result<String, Error> { args.get(i).cloned().ok_or_else(|| USAGE.into()) };
    let sock =
        std::env::var("CRI_SOCK").unwrap_or_else(|_| "/run/containerd/containerd.sock".into());
    let ch = connect(sock).await?;
    let mut rt = RuntimeServiceClient::new(ch.clone());
    match arg(0)?.as_str() {
        "version" => {
            let v = rt
                .version(VersionRequest {
                    version: "v1".into(),
                })
                .await?
                .into_inner();
            println!(
                "{} {} {}",
                v.runtime_name, v.runtime_version, v.runtime_api_version
            );
        }
        "runp" => {
            let (name, ns, uid) = (arg(1)?, arg(2)?, arg(3)?);
            let (anns, ports): (Vec<&String>, Vec<&String>) =
                args[4..].iter().partition(|a| a.contains('='));
            let ports = ports
                .into_iter()
                .map(|p| port_mapping(p))
                .collect::<Result<Vec<_>, _>>()?;
            let annotations: HashMap<String, String> = anns
                .into_iter()
                .filter_map(|a| a.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            std::fs::create_dir_all(log_dir(&ns, &name, &uid))?;
            let req = RunPodSandboxRequest {
                config: Some(sandbox_config(&name, &ns, &uid, ports, annotations)),
                runtime_handler: String::new(),
            };
            println!(
                "{}",
                rt.run_pod_sandbox(req).await?.into_inner().pod_sandbox_id
            );
        }
        "ip" => {
            let st = pod_status(&mut rt, &arg(1)?).await?;
            println!("{}", st.network.map(|n| n.ip).unwrap_or_default());
        }
        "stopp" => {
            rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: arg(1)?,
            })
            .await?;
        }
        "rmp" => {
            rt.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: arg(1)?,
            })
            .await?;
        }
        "lsp" => {
            let items = rt
                .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                .await?
                .into_inner()
                .items;
            for p in items {
                let m = p.metadata.unwrap_or_default();
                println!("{} {}/{} {}", p.id, m.namespace, m.name, p.state);
            }
        }
        "cniconfig" => {
            let st = rt
                .status(StatusRequest { verbose: true })
                .await?
                .into_inner();
            let conf = st
                .info
                .get("cniconfig")
                .ok_or("the runtime reports no cniconfig")?;
            println!("{conf}");
        }
        "run" => {
            let (pod, image) = (arg(1)?, arg(2)?);
            if args.len() < 4 {
                return Err(USAGE.into());
            }
            return run_container(ch, &pod, &image, args[3..].to_vec()).await;
        }
        "runspec" => return run_spec(ch, &args[1..]).await,
        "exec" => {
            let (id, timeout) = (arg(1)?, arg(2)?.parse::<i64>()?);
            if args.len() < 4 {
                return Err(USAGE.into());
            }
            let r = rt
                .exec_sync(ExecSyncRequest {
                    container_id: id,
                    cmd: args[3..].to_vec(),
                    timeout,
                })
                .await?
                .into_inner();
            print!("{}", String::from_utf8_lossy(&r.stdout));
            eprint!("{}", String::from_utf8_lossy(&r.stderr));
            return Ok(r.exit_code);
        }
        "pid" => {
            let st = rt
                .container_status(ContainerStatusRequest {
                    container_id: arg(1)?,
                    verbose: true,
                })
                .await?
                .into_inner();
            let info = st.info.get("info").ok_or("no verbose info")?;
            // containerd's verbose info is JSON with "pid": N.
            let pid = info
                .split("\"pid\":")
                .nth(1)
                .and_then(|r| r.trim_start().split(|c: char| !c.is_ascii_digit()).next())
                .ok_or("no pid in the container's info")?;
            println!("{pid}");
        }
        other => return Err(format!("unknown command {other:?}\n{USAGE}").into()),
    }
    Ok(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match real_main(args).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("cri-client: {e}");
            std::process::exit(1);
        }
    }
}
