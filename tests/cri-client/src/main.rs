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

const USAGE: &str = "usage: cri-client version | runp NAME NAMESPACE UID [HOST:CTR[/udp]...] [KEY=VALUE...] | ip POD | stopp POD | rmp POD | lsp | cniconfig | run POD IMAGE CMD [ARG...]";

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
        hostname: name.into(),
        log_directory: log_dir(ns, name, uid),
        port_mappings: ports,
        labels,
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
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
