//! Times hand-written WGSL compute kernels through wgpu, in turn, on the first Vulkan adapter
//! (else the first GL one) — for experiments on generated code: dump a kernel
//! (`FUSEGRAPH_DUMP_WGSL=DIR`), edit it, time it beside the original. Every `@binding` of group 0 gets a storage buffer of `N` random f32
//! values in [-2, 2); each kernel (entry point `main`) is dispatched as `WORKGROUPS`×1×1
//! workgroups, once untimed, then once per round for `RUNS` rounds, the kernels in turn
//! within a round so they see the same machine load; the wall time of submit and wait is
//! printed as median and minimum per kernel.
//!
//! ```text
//! cargo run --release -p fusegraph-runtime --example time_wgsl -- N RUNS WORKGROUPS FILE.wgsl...
//! ```

use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("time_wgsl: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: time_wgsl N RUNS WORKGROUPS FILE.wgsl...";
    let [n, runs, workgroups, files @ ..] = &args[..] else { return Err(usage.into()) };
    let number = |what: &str, v: &str| {
        v.parse::<u64>().ok().filter(|&x| x > 0).ok_or(format!("{what} `{v}` is not a positive count ({usage})"))
    };
    let (n, runs, workgroups) = (number("N", n)?, number("RUNS", runs)?, number("WORKGROUPS", workgroups)?);
    if files.is_empty() {
        return Err(usage.into());
    }
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
    let (wgpu_device, queue) = pollster::block_on(
        adapter.request_device(&wgpu::DeviceDescriptor { required_limits: adapter.limits(), ..Default::default() }),
    )
    .map_err(|e| e.to_string())?;
    let mut seed = 1u64;
    let mut kernels = Vec::new();
    for file in files {
        let src = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        let bindings = src.matches("@binding(").count();
        let buffers: Vec<wgpu::Buffer> = (0..bindings)
            .map(|_| {
                let data: Vec<f32> = (0..n)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
                    })
                    .collect();
                let buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(file),
                    size: n * 4,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
                buffer
            })
            .collect();
        let scope = wgpu_device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = wgpu_device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(file),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
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
        kernels.push((file, pipeline, bind_group, buffers, Vec::new()));
    }
    for round in 0..=runs {
        for (_, pipeline, bind_group, _, ms) in kernels.iter_mut() {
            let mut encoder = wgpu_device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &*bind_group, &[]);
                pass.dispatch_workgroups(workgroups as u32, 1, 1);
            }
            let start = Instant::now();
            queue.submit([encoder.finish()]);
            wgpu_device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| e.to_string())?;
            if round > 0 {
                ms.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    for (file, _, _, _, ms) in kernels.iter_mut() {
        ms.sort_by(|a, b| a.total_cmp(b));
        println!("{file}: median {:.2} ms, min {:.2} ms ({} runs)", ms[ms.len() / 2], ms[0], ms.len());
    }
    Ok(())
}
