//! The deterministic text form (`%3 = add(%1, %2) : f32[256,1024]`) and its parser.
