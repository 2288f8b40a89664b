"""Running a generated repository: the model cache, the bundled tritonserver, the serve loop."""
