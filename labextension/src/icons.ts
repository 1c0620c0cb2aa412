import { LabIcon } from '@jupyterlab/ui-components';

const gpuSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161">
<path d="M4 6h14a2 2 0 0 1 2 2v1h2v2h-2v2h2v2h-2v1a2 2 0 0 1-2 2H4V6zm2 2v8h12V8H6zm2 2h3v4H8v-4zm5 0h3v4h-3v-4z"/>
<path d="M2 4h2v16H2z"/>
</g></svg>`;

export const gpuIcon = new LabIcon({ name: 'gpulab:gpu', svgstr: gpuSvg });
