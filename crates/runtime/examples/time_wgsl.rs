//! Times hand-written WGSL compute kernels through wgpu, in turn, on the first Vulkan adapter
//! (else the first GL one) — for experiments on generated code: dump a kernel
//! (`FUSEGRAPH_DUMP_WGSL=DIR`, or `fusegraph wgsl`), edit it, time it beside the original.
//! Every `@binding` of group 0 gets a storage buffer of `N` random values in [-2, 2) (f32, or
//! f16 where the binding is declared `array<f16>` or `array<vec4<f16>>`: `enable f16;` needs an
//! adapter with `SHADER_F16`); each kernel (entry point `main`) is dispatched as `WORKGROUPS`
//! workgroups (`auto`: the count in the kernel's `// kernel … (W workgroups)` header, as
//! `fusegraph wgsl` writes it), over two dimensions past 65535 as the runtime does, once
//! untimed, then once per round for `RUNS` rounds (`--reps R`: R dispatches back to back, the
//! time per dispatch), the kernels in turn within a round so they
//! see the same machine load. Printed per kernel: median and minimum of the compute pass's GPU
//! timestamps where the adapter has them, else of the wall time of submit and wait.
//! Kernels keep wgpu's runtime checks (index clamps, loop-bounding counters), since edited
//! kernels are not trusted as the runtime trusts its own: `--checks off` creates them
//! without (as the runtime does by default), `--checks both` times each kernel both ways in
//! turn (the second as `FILE (unchecked)`).
//!
//! ```text
//! cargo run --release -p fusegraph-runtime --example time_wgsl -- [--checks on|off|both] [--reps R] N RUNS WORKGROUPS|auto FILE.wgsl...
//! ```

use clap::Parser;

use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("time_wgsl: {e}");
        std::process::exit(1);
    }
}

/// Times WGSL compute kernels in turn (see the module docs).
#[derive(Parser)]
struct Args {
    /// Elements of every storage buffer.
    n: u64,
    /// Timed rounds.
    runs: u64,
    /// Workgroups per dispatch, or `auto` for the count in each kernel's header comment.
    workgroups: String,
    /// The kernels (entry point `main`).
    #[arg(required = true)]
    files: Vec<String>,
    /// wgpu's runtime checks in each kernel: on, off, or both in turn.
    #[arg(long, value_parser = ["on", "off", "both"], default_value = "on")]
    checks: String,
    /// Dispatches per timed pass, back to back (each time is the pass's over this count):
    /// more than one keeps a GPU's clocks up through the measurement.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
}

fn run() -> Result<(), String> {
    let args = Args::parse();
    let positive = |what: &str, v: u64| if v > 0 { Ok(v) } else { Err(format!("{what} must be positive")) };
    let (n, runs) = (positive("N", args.n)?, positive("RUNS", args.runs)?);
    let workgroups = match args.workgroups.as_str() {
        "auto" => None,
        w => Some(
            w.parse::<u64>().ok().filter(|&x| x > 0).ok_or(format!("WORKGROUPS `{w}`: a positive count or `auto`"))?,
        ),
    };
    let files = &args.files;
    let instance = wgpu::Instance::new({
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::GL;
        desc
    });
    let mut adapter = None;
    for backend in [wgpu::Backends::VULKAN, wgpu::Backends::GL] {
        adapter = adapter.or_else(|| pollster::block_on(instance.enumerate_adapters(backend)).into_iter().next());
    }
    let adapter = adapter.ok_or("no Vulkan or GL adapter")?;
    let info = adapter.get_info();
    eprintln!("adapter: {} ({:?}, {})", info.name, info.backend, info.driver_info);
    let features = adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY);
    let (wgpu_device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .map_err(|e| e.to_string())?;
    let timestamps = features.contains(wgpu::Features::TIMESTAMP_QUERY).then(|| {
        let set = wgpu_device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("time_wgsl"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let buffer = |usage| {
            wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("time_wgsl timestamps"),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolve = buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let read = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        (set, resolve, read)
    });
    let max_dim = wgpu_device.limits().max_compute_workgroups_per_dimension as u64;
    let mut seed = 1u64;
    let checks: &[bool] = match args.checks.as_str() {
        "off" => &[false],
        "both" => &[true, false],
        _ => &[true],
    };
    let mut kernels = Vec::new();
    for (file, checked) in files.iter().flat_map(|f| checks.iter().map(move |&c| (f, c))) {
        let label = if checked { file.clone() } else { format!("{file} (unchecked)") };
        let src = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        let wg = match workgroups {
            Some(w) => w,
            None => header_workgroups(&src).ok_or(format!("{file}: no `// kernel … (W workgroups)` header"))?,
        };
        let dispatch = if wg <= max_dim { (wg, 1) } else { (max_dim, wg.div_ceil(max_dim)) };
        let buffers: Vec<wgpu::Buffer> = src
            .lines()
            .filter(|l| l.contains("@binding("))
            .map(|decl| {
                let mut values = (0..n).map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
                });
                let bytes: Vec<u8> = if decl.contains("array<f16>") || decl.contains("array<vec4<f16>>") {
                    values.flat_map(|v| half::f16::from_f32(v).to_le_bytes()).collect()
                } else {
                    values.by_ref().flat_map(f32::to_le_bytes).collect()
                };
                let buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(file),
                    size: bytes.len() as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                queue.write_buffer(&buffer, 0, &bytes);
                buffer
            })
            .collect();
        let scope = wgpu_device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor { label: Some(file), source: wgpu::ShaderSource::Wgsl(src.into()) };
        let module = match checked {
            true => wgpu_device.create_shader_module(desc),
            // SAFETY: asked for by the user, for kernels whose indexing they trust.
            false => unsafe { wgpu_device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) },
        };
        let pipeline = wgpu_device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(file),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("{file}: {e}"));
        }
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        let layout = pipeline.get_bind_group_layout(0);
        let bind_group = wgpu_device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(file),
            layout: &layout,
            entries: &entries,
        });
        kernels.push((label, pipeline, bind_group, buffers, dispatch, Vec::new()));
    }
    let wait = || wgpu_device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| e.to_string());
    for round in 0..=runs {
        for (_, pipeline, bind_group, _, (x, y), ms) in kernels.iter_mut() {
            let mut encoder = wgpu_device.create_command_encoder(&Default::default());
            {
                let timestamp_writes = timestamps.as_ref().map(|(set, _, _)| wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                });
                let mut pass =
                    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes });
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &*bind_group, &[]);
                for _ in 0..args.reps {
                    pass.dispatch_workgroups(*x as u32, *y as u32, 1);
                }
            }
            if let Some((set, resolve, read)) = &timestamps {
                encoder.resolve_query_set(set, 0..2, resolve, 0);
                encoder.copy_buffer_to_buffer(resolve, 0, read, 0, 16);
            }
            let start = Instant::now();
            queue.submit([encoder.finish()]);
            wait()?;
            let mut t = start.elapsed().as_secs_f64() * 1e3;
            if let Some((_, _, read)) = &timestamps {
                read.map_async(wgpu::MapMode::Read, .., |_| {});
                wait()?;
                {
                    let view = read.get_mapped_range(..).map_err(|e| e.to_string())?;
                    let tick = |at: usize| u64::from_le_bytes(view[at..at + 8].try_into().expect("8 bytes"));
                    t = tick(8).saturating_sub(tick(0)) as f64 * queue.get_timestamp_period() as f64 / 1e6;
                }
                read.unmap();
            }
            if round > 0 {
                ms.push(t / args.reps as f64);
            }
        }
    }
    let clock = if timestamps.is_some() { "GPU timestamps" } else { "wall time" };
    for (file, _, _, _, _, ms) in kernels.iter_mut() {
        ms.sort_by(|a, b| a.total_cmp(b));
        println!("{file}: median {:.3} ms, min {:.3} ms ({} runs, {clock})", ms[ms.len() / 2], ms[0], ms.len());
    }
    Ok(())
}

/// The workgroup count in a `// kernel … (W workgroups)` header line.
fn header_workgroups(src: &str) -> Option<u64> {
    let line = src.lines().find(|l| l.starts_with("// kernel "))?;
    let open = line.rfind('(')?;
    line[open + 1..].strip_suffix(" workgroups)")?.parse().ok()
}
